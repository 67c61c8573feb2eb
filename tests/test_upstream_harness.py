"""The harness that runs vLLM's own tests (upstream_tests/): allow-list validation, the tiny
hub's tokenizers against the real families' conventions, JUnit parsing, and the pytest
plugin's per-test modes run on a small generated test file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from upstream_tests import allowlist, hub, run, store
from upstream_tests.run import outcome_counts, parse_junit

REPO = Path(__file__).resolve().parent.parent


def _load(tmp_path, text: str):
    path = tmp_path / "allow.yaml"
    path.write_text(textwrap.dedent(text))
    return allowlist.load(path)


def _plugin_runs(tmp_path, env: dict, files: list[str]) -> dict[str, tuple[int, dict]]:
    """pytest under the harness's plugin, one process per file as the runner starts them
    (all at once: each imports vLLM, ~10 s of CPU): file -> (exit code, JUnit outcomes)."""
    procs = {}
    for name in files:
        xml = tmp_path / (Path(name).stem + ".xml")
        procs[name] = (xml, subprocess.Popen(
            [sys.executable, "-m", "pytest", name, "-p", "upstream_tests.plugin",
             "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit2"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    out = {}
    for name, (xml, proc) in procs.items():
        text, _ = proc.communicate(timeout=300)
        assert xml.exists(), text[-3000:]
        out[name] = (proc.returncode, parse_junit(xml, name))
    return out


def test_the_shipped_allowlist_is_valid_and_has_a_ci_slice():
    rules = allowlist.load()
    assert rules.files_to_run(ci=True)
    assert set(rules.files_to_run(ci=True)) <= set(rules.files_to_run())


@pytest.mark.parametrize("rule, message", [
    ("{mode: skip}", "mode 'skip'; valid: ('must-pass', 'expected-fail', 'excluded')"),
    ("{mode: excluded, reason: x}", "excluded needs a class, one of"),
    ("{mode: expected-fail, class: cuda}", "expected-fail needs a reason"),
    ("{mode: excluded, class: cuda, reason: x, why: y}", "unknown keys ['why']"),
    ("{lift_module_skip: {match: CUDA}}", "lift_module_skip needs exactly ['match', 'reason']"),
    ("{alone: ''}", "alone needs the reason"),
])
def test_a_bad_allowlist_entry_is_refused_with_its_name(tmp_path, rule, message):
    with pytest.raises(ValueError, match="tests/a.py") as e:
        _load(tmp_path, f"files:\n  tests/a.py: {rule}\n")
    assert message in str(e.value)


def test_known_failures_need_a_pattern_class_and_reason(tmp_path):
    with pytest.raises(ValueError, match="known failure needs exactly"):
        _load(tmp_path, "known_failures:\n  - {match: x, class: cuda}\n")
    rules = _load(tmp_path, """\
        known_failures:
          - {match: g, class: cuda, reason: global}
        files:
          tests/a.py:
            known_failures:
              - {match: f, class: real-model, reason: own}
          tests/b.py: {mode: excluded, class: network, reason: downloads}
        """)
    assert [k["reason"] for k in rules.entry("tests/a.py")["known_failures"]] == ["own", "global"]
    assert rules.files_to_run() == ["tests/a.py"]
    assert list(rules.excluded_files()) == ["tests/b.py"]


@pytest.mark.parametrize("hub_id, ids, prompt", [
    # OPT: `</s>` (id 2) is both BOS and EOS and starts every prompt; `<pad>` is 1
    ("facebook/opt-125m", dict(bos=2, eos=2, pad=1), None),
    # Llama 3 Instruct: <|begin_of_text|> first, turns end with <|eot_id|>
    ("meta-llama/Llama-3.2-1B-Instruct", dict(bos=0, eos=4, pad=None),
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    # Qwen3: ChatML, no BOS, EOS <|im_end|>, pad <|endoftext|>
    ("Qwen/Qwen3-0.6B", dict(bos=None, eos=2, pad=0),
     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    # R1 distilled: DeepSeek's sentence tokens, the answer opens with <think>
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", dict(bos=0, eos=1, pad=None),
     "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n"),
])
def test_hub_tokenizers_carry_the_real_families_special_tokens(tmp_path, hub_id, ids, prompt):
    from transformers import AutoTokenizer

    path = hub.build(hub_id, root=tmp_path)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == \
        (ids["bos"], ids["eos"], ids["pad"])
    encoded = tok("hello world").input_ids
    assert (encoded[0] == ids["bos"]) == (ids["bos"] is not None)
    if prompt:
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True) == prompt
    # laid out as the hub cache: refs/main names the snapshot
    assert (path.parent.parent / "refs" / "main").read_text() == path.name


def test_hub_ids_found_in_test_sources():
    source = 'LLM("facebook/opt-125m")\nmodel = \'Qwen/Qwen3-0.6B\'\n# Qwen/Qwen3-8B in prose'
    assert hub.used_by(source) == ["facebook/opt-125m", "Qwen/Qwen3-0.6B"]


GENERATED = '''
import pytest

def test_ok():
    pass

def test_refused():
    raise ValueError("--block-size 16 is not supported on the NPU: ...")

def test_other_failure():
    raise ValueError("something else")

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 1

def test_left_out():
    raise AssertionError("never runs")

class TestGroup:
    def test_in_class(self):
        pass

@pytest.mark.parametrize("name", ["org/a", "other/b[1]"])
def test_named(name):
    assert name.startswith("org/")
'''


def test_plugin_applies_modes_and_known_failures_per_test(tmp_path):
    """The plugin on a generated file: expected-fail is strict, excluded is skipped with
    its class, a known failure counts as expected only when its text matches."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_gen.py").write_text(GENERATED)
    entry = {"known_failures": [{"match": r"--block-size \d+ is not supported on the NPU",
                                 "class": "device-rule", "reason": "blocks of 128"}],
             "tests": {"test_param[2]": {"mode": "expected-fail", "class": "real-model",
                                         "reason": "wants the real weights"},
                       "test_left_out": {"mode": "excluded", "class": "network",
                                         "reason": "downloads"},
                       # a wildcard: `*` matches anything, brackets are literal
                       "test_named[*other/b[*]": {"mode": "excluded", "class": "network",
                                                  "reason": "downloads"}}}
    xml = tmp_path / "out.xml"
    env = dict(os.environ, VLLM_NPU_UPSTREAM_ENTRY=json.dumps(entry),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_gen.py", "-p", "upstream_tests.plugin",
         "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    got = parse_junit(xml, "tests/test_gen.py")
    assert got == {
        "tests/test_gen.py::test_ok": "passed",
        "tests/test_gen.py::test_refused": "xfailed:device-rule",
        "tests/test_gen.py::test_other_failure": "failed",
        "tests/test_gen.py::test_param[1]": "passed",
        "tests/test_gen.py::test_param[2]": "xfailed:real-model",
        "tests/test_gen.py::test_left_out": "excluded:network",
        "tests/test_gen.py::TestGroup::test_in_class": "passed",
        "tests/test_gen.py::test_named[org/a]": "passed",
        "tests/test_gen.py::test_named[other/b[1]]": "excluded:network",
    }
    assert outcome_counts(got) == {"passed": 4, "xfailed": 2, "excluded": 2, "failed": 1}


def test_a_module_failing_to_import_for_a_known_reason_is_an_expected_failure(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_known.py").write_text(
        "raise OSError(\"We couldn't connect to 'https://huggingface.co' to load this file\")\n")
    (tmp_path / "tests" / "test_other.py").write_text("raise ImportError('no such module')\n")
    entry = {"known_failures": [{"match": "We couldn't connect to 'https://huggingface.co'",
                                 "class": "network", "reason": "downloads"}]}
    env = dict(os.environ, VLLM_NPU_UPSTREAM_ENTRY=json.dumps(entry),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    runs = _plugin_runs(tmp_path, env, ["tests/test_known.py", "tests/test_other.py"])
    got = {Path(name).stem: (rc, sorted(outcomes.values())) for name, (rc, outcomes) in
           runs.items()}
    # 5: pytest collected no test, which the runner accepts; 2: a collection error
    assert got == {"test_known": (5, ["xfailed:network"]), "test_other": (2, ["failed"])}


GUARDED = """
import pytest

if {guard}:
    pytest.skip(reason="V1 currently only supported on CUDA.", allow_module_level=True)
if {other}:
    pytest.skip(reason="needs 2 GPUs", allow_module_level=True)

def test_runs():
    pass
"""


def test_a_lifted_module_skip_lets_the_module_import_on(tmp_path):
    """The lifted guard no longer skips (the test runs); a skip for another reason is
    pytest's."""
    (tmp_path / "tests").mkdir()
    files = {"tests/test_lifted.py": (True, False, ["passed"]),
             "tests/test_other_skip.py": (False, True, ["skipped"])}
    for name, (guard, other, _) in files.items():
        (tmp_path / name).write_text(GUARDED.format(guard=guard, other=other))
    entry = {"lift_module_skip": {"match": "only supported on CUDA", "reason": "V1 runs"}}
    env = dict(os.environ, VLLM_NPU_UPSTREAM_ENTRY=json.dumps(entry),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    runs = _plugin_runs(tmp_path, env, list(files))
    assert {name: sorted(outcomes.values()) for name, (_, outcomes) in runs.items()} == \
        {name: want for name, (_, _, want) in files.items()}


BLOCK_SIZES = """
import vllm_npu.platform as npu_platform
from vllm_npu.attention.backend import NPUAttentionBackend

def test_block_sizes():
    assert ({relaxed}) == (16 in npu_platform.PAGED_BLOCK_SIZES)
    sizes = NPUAttentionBackend.get_supported_kernel_block_sizes()
    assert [getattr(s, "base", s) for s in sizes] == [16 if {relaxed} else 128]
"""


# A test file's autouse fixture tears down after the test's own `monkeypatch` is undone
# (tests/utils_/test_cpu_resource_utils.py relies on it): the harness's fixtures must not
# make `monkeypatch` the first fixture set up.
TEARDOWN_ORDER = """
import os
import pytest

ORIGINAL = os.getcwd

@pytest.fixture(autouse=True)
def _check_restored():
    yield
    assert os.getcwd is ORIGINAL

def test_patches(monkeypatch):
    monkeypatch.setattr(os, "getcwd", lambda: "/nowhere")
"""


def test_kernel_block_sizes_are_relaxed_only_where_upstream_relaxes_the_cpu_ones(tmp_path):
    """tests/v1/kv_connector/unit: connector logic, no attention kernel (its conftest
    relaxes the CPU backend's sizes); anywhere else the NPU's rule stands. And a file's
    own fixtures keep their teardown order under the harness."""
    for where, relaxed in (("tests/v1/kv_connector/unit", True), ("tests/v1/core", False)):
        (tmp_path / where).mkdir(parents=True)
        name = f"test_sizes_{where.rsplit('/', 1)[1]}.py"  # rootdir-relative imports: unique
        (tmp_path / where / name).write_text(BLOCK_SIZES.format(relaxed=relaxed))
    (tmp_path / "tests/v1/core/test_teardown_order.py").write_text(TEARDOWN_ORDER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-p", "upstream_tests.plugin",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "3 passed" in proc.stdout and "error" not in proc.stdout, proc.stdout[-3000:]


STORED_RUN = """<testsuites><testsuite>
<testcase classname="tests.test_s" name="test_ok"/>
<testcase classname="tests.test_s" name="test_net"><failure message="OSError: offline">
Traceback: LONG We couldn't connect to 'https://huggingface.co'</failure></testcase>
<testcase classname="tests.test_s" name="test_bad"><failure message="ValueError: x"/></testcase>
<testcase classname="tests.test_s" name="test_now_xfail[a]"/>
<testcase classname="tests.test_s.TestA" name="test_now_excluded"><failure message="e"/>
</testcase>
<testcase classname="tests.test_s" name="test_fixed"><failure message="[XPASS(strict)] [cuda] r"/>
</testcase>
</testsuite></testsuites>"""


def test_stored_results_are_rejudged_under_the_allowlist_as_it_is_now(tmp_path, monkeypatch):
    """An allow-list edit applies to results already stored (runs span sessions): a known
    failure text, a strict expected failure that passed, an exclusion by wildcard; the
    same from the JUnit XML and from the repository's store, where a long failure text
    keeps its end."""
    xml = tmp_path / "r.xml"
    xml.write_text(STORED_RUN.replace("LONG", "frame\n" * 2000))
    monkeypatch.setattr(store, "STORE", tmp_path / "store")
    cases = run.junit_cases(xml, "tests/test_s.py")
    store.save("tests/test_s.py", {
        "rc": 1, "seconds": 1.0, "commit": "abc", "date": "2026-12-06",
        "cases": {rest: o for rest, (o, _) in cases.items()},
        "failures": {rest: store.failure_kept(*f) for rest, (_, f) in cases.items() if f}})
    assert store.paths() == ["tests/test_s.py"]
    assert (tmp_path / "store" / "top-level.json").exists()
    entry = {"known_failures": [{"match": "couldn't connect to 'https://huggingface.co'",
                                 "class": "network", "reason": "r"}],
             "tests": {"test_now_xfail": {"mode": "expected-fail", "class": "cuda",
                                          "reason": "r"},
                       "TestA::*": {"mode": "excluded", "class": "other-device",
                                    "reason": "r"}}}
    expected = {
        "tests/test_s.py::test_ok": "passed",
        "tests/test_s.py::test_net": "xfailed:network",
        "tests/test_s.py::test_bad": "failed",
        "tests/test_s.py::test_now_xfail[a]": "failed",  # strict: it passed
        "tests/test_s.py::TestA::test_now_excluded": "excluded:other-device",
        # listed as an expected failure when it ran and passed; its entry since removed
        "tests/test_s.py::test_fixed": "passed",
    }
    assert parse_junit(xml, "tests/test_s.py", entry=entry) == expected
    stored = run.stored_result("tests/test_s.py", entry)
    assert stored["tests"] == expected and stored["commit"] == "abc"
    assert stored["failures"]["tests/test_s.py::test_bad"] == "ValueError: x"
    # unlisted (no entry): the outcomes as the plugin judged them when the file ran
    assert run.stored_result("tests/test_s.py")["tests"]["tests/test_s.py::test_net"] == "failed"


def test_files_with_wall_clock_budgets_run_after_the_others_one_at_a_time(tmp_path,
                                                                        monkeypatch):
    rules = _load(tmp_path, """\
        files:
          tests/a.py: {alone: "servers up within 30 s"}
          tests/b.py: {}
          tests/c.py: {}
        """)
    order = []

    def fake_run(path, entry, timeout_s, keep):
        order.append(path)
        return {"path": path, "seconds": 1.0, "tests": {f"{path}::t": "passed"},
                "failures": {}}

    monkeypatch.setattr(run.allowlist, "load", lambda: rules)
    for name in ("prepare_sources", "prepare_site"):
        monkeypatch.setattr(run, name, lambda: None)
    monkeypatch.setattr(run.hub, "build_all", lambda ids: None)
    monkeypatch.setattr(run, "run_file", fake_run)
    monkeypatch.setattr(run, "WORK", tmp_path)
    monkeypatch.setattr(run, "SRC", tmp_path)
    (tmp_path / "tests").mkdir()
    for name in "abc":
        (tmp_path / "tests" / f"{name}.py").write_text("")
    assert run.main(["-j", "2"]) == 0
    assert sorted(order[:2]) == ["tests/b.py", "tests/c.py"] and order[2] == "tests/a.py"
