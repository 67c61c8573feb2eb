"""Run vLLM 0.33.0's own tests against the NPU plugin, file by file, per the allow-list.

    python -m upstream_tests.run                 # the whole allow-list
    python -m upstream_tests.run --slice ci      # the CI slice (entries marked `ci: true`)
    python -m upstream_tests.run tests/v1/core/test_scheduler.py   # chosen files
    python -m upstream_tests.run --missing       # what has no stored result yet
    python -m upstream_tests.run --reuse --report docs/upstream_tests.md

Prepares on first use, with nothing but the package index: vLLM's `tests/` from the sdist
`make install` fetched (build/sdist), the test-only packages they import into
build/upstream/site (kept out of the project's venv, so its own suite is unchanged), and
the tiny hub models the chosen files name (hub.py). Each file runs in its own pytest
process (the harness plugin loaded through PYTEST_PLUGINS) with the hub offline; results
come back as JUnit XML, are recorded in upstream_tests/results/ (store.py: a full run
spans sessions) and end in one pytest-style summary line. Exit status 1 if any test that
must pass did not.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from upstream_tests import allowlist, hub, store

REPO = Path(__file__).resolve().parent.parent
VLLM_VERSION = "0.33.0"
WORK = REPO / "build" / "upstream"
SRC = WORK / f"vllm-{VLLM_VERSION}"
SITE = WORK / "site"
RESULTS = WORK / "results"
# What vLLM's tests import beyond the project's venv (requirements/test/cuda.in; the
# Cohere parsers' cohere-melody, the Cohere API tests' SDK), installed without their
# dependencies: the venv has the rest (pytest, packaging, httpx, pydantic, tokenizers).
TEST_PACKAGES = ("tblib", "pytest-asyncio", "pytest-forked", "pytest-rerunfailures", "py",
                 "cohere-melody", "cohere", "fastavro", "types-requests")
FILE_TIMEOUT_S = 900   # one test (pytest-timeout)
FILE_LIMIT_TESTS = 3   # a whole file: this many tests' worth
OUTCOMES = ("passed", "xfailed", "excluded", "skipped", "failed")


def prepare_sources() -> None:
    if (SRC / "tests" / "conftest.py").exists() and (SRC / "benchmarks").is_dir():
        return
    sdist = REPO / "build" / "sdist" / f"vllm-{VLLM_VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "fetch_sdist.py"), "vllm",
                        VLLM_VERSION, str(sdist.parent)], check=True, stdout=subprocess.DEVNULL)
    prefix = f"vllm-{VLLM_VERSION}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   # examples/: the chat templates the tests load from it; benchmarks/:
                   # the request functions the benchmark tests compare with
                   if m.name.startswith((prefix + "tests/", prefix + "examples/",
                                         prefix + "benchmarks/", prefix + "pyproject.toml"))]
        tar.extractall(WORK, members=members, filter="data")


def prepare_site() -> None:
    stamp = SITE / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(TEST_PACKAGES):
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--upgrade", "--target", str(SITE), *TEST_PACKAGES],
                   check=True)
    stamp.write_text(" ".join(TEST_PACKAGES))


def file_env(entry: dict) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        # tests/vllm_test_utils: a helper package upstream CI pip-installs from the tree
        "PYTHONPATH": os.pathsep.join([str(SITE), str(SRC), str(SRC / "tests" / "vllm_test_utils"),
                                       str(REPO)]),
        # the harness plugin by environment, not `-p`: pytest processes the tests start
        # themselves (pytester, subprocess checks) load it too
        "PYTEST_PLUGINS": "upstream_tests.plugin",
        # the venv's console scripts (`vllm serve` in the server tests)
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "HF_HUB_CACHE": str(hub.ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "VLLM_MODEL_REDIRECT_PATH": str(hub.ROOT / "redirect.json"),
        "VLLM_NPU_UPSTREAM_ENTRY": json.dumps(entry),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        # pytest's numbered temp folders apart from a suite running beside
        "PYTEST_DEBUG_TEMPROOT": str(WORK / "tmp"),
    })
    return env


def _stem(path: str) -> str:
    """The file name its log, JUnit XML and JSON result are stored under."""
    return path.replace("/", "__")


@functools.cache
def _commit() -> str:
    """The commit a run's results were produced at (a `+` when the tree had changes when
    the run started: edits made while it runs do not count)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=REPO, capture_output=True, text=True).stdout.strip()
    return head + ("+" if dirty else "")


def run_file(path: str, entry: dict, timeout_s: int = FILE_TIMEOUT_S,
             keep: bool = True) -> dict:
    """One test file in its own pytest process; its outcomes by test id, recorded in the
    repository's store when `keep` (the CI slice does not write into its checkout)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (WORK / "tmp").mkdir(exist_ok=True)
    stem = _stem(path)
    xml, log = RESULTS / f"{stem}.xml", RESULTS / f"{stem}.log"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", path, "-q", "-rfE", "-p", "no:cacheprovider",
           "-c", str(SRC / "pyproject.toml"), "--rootdir", str(SRC), f"--junitxml={xml}",
           "-o", "junit_family=xunit2", f"--timeout={timeout_s}"]
    start = time.time()
    with open(log, "w") as out:
        # its own session: whatever the file started (engine cores, servers, workers) is
        # killed with it, even when pytest itself was killed or timed out
        proc = subprocess.Popen(cmd, cwd=SRC, env=file_env(entry), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=FILE_LIMIT_TESTS * timeout_s + 60)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    cases = junit_cases(xml, path) if xml.exists() else {}
    if not cases or rc == "timeout" or (
            rc not in (0, 1, 5) and all(c[0] != "failed" for c in cases.values())):
        cases["<file>"] = ("failed", None)  # crashed, timed out or did not collect
    result = {"path": path, "rc": rc, "seconds": round(time.time() - start, 1),
              "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
              "tests": {f"{path}::{rest}": o for rest, (o, _) in cases.items()},
              "failures": {f"{path}::{rest}": f[0].strip().split("\n", 1)[0][:300]
                           for rest, (_, f) in cases.items() if f},
              "log": str(log.relative_to(REPO))}
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    if keep:
        store.save(path, {
            **{k: result[k] for k in ("rc", "seconds", "commit", "date")},
            "cases": {rest: o for rest, (o, _) in cases.items()},
            "failures": {rest: store.failure_kept(*f) for rest, (_, f) in cases.items() if f}})
    return result


def stored_result(path: str, entry: dict | None = None) -> dict | None:
    """The last result of `path` kept in the store, if any; with `entry`, its outcomes
    re-judged under the allow-list entry as it is now."""
    record = store.load(path)
    if record is None:
        return None
    tests, failures = {}, {}
    for rest, outcome in record["cases"].items():
        failure = record["failures"].get(rest)
        if entry is not None and rest != "<file>":
            outcome = reapply(entry, rest, outcome, failure)
        tests[f"{path}::{rest}"] = outcome
        if failure:
            failures[f"{path}::{rest}"] = failure[0].strip().split("\n", 1)[0][:300]
    return {"path": path, **{k: record[k] for k in ("rc", "seconds", "commit", "date")},
            "tests": tests, "failures": failures,
            "log": str((RESULTS / f"{_stem(path)}.log").relative_to(REPO))}


COLLECTION_XFAIL = "expected-fail at collection"  # plugin.py's collection skip reason
XPASS_STRICT = "[XPASS(strict)]"  # pytest's failure message for a strict xfail that passed
CLASS_IN_REASON = re.compile(r"^(?:excluded )?\[([a-z-]+)\]")


def _case_name(rest: str) -> str:
    """The test's name without its class: `A::test_x[p::q]` -> `test_x[p::q]`."""
    head, bracket, params = rest.partition("[")
    return head.rsplit("::", 1)[-1] + bracket + params


def reapply(entry: dict, rest: str, outcome: str, failure: list[str] | None) -> str:
    """A stored outcome under the allow-list entry as it is now (what plugin.py would have
    made of the same run): exclusions, strict expected failures, known failure texts.
    `failure`: the message and text of a test that failed outright."""
    from upstream_tests.plugin import known_failure, rule_for_names

    rule = rule_for_names(rest, _case_name(rest), entry.get("tests") or {}) or entry
    mode = rule.get("mode", "must-pass")
    if outcome == "failed" and failure and failure[0].startswith(XPASS_STRICT):
        outcome = "passed"  # it was an expected failure then, and it passed
    if mode == "excluded":
        return f"excluded:{rule['class']}"
    ran = outcome in ("passed", "failed") or outcome.startswith("xfailed")
    if mode == "expected-fail":
        return "failed" if outcome == "passed" else (
            f"xfailed:{rule['class']}" if ran else outcome)
    if outcome.startswith("excluded"):
        return "skipped"  # excluded when it ran: no outcome to keep
    if outcome == "failed" and failure is not None:
        known = known_failure("\n".join(failure), entry)
        if known:
            return f"xfailed:{known['class']}"
    return outcome


def junit_cases(xml: Path, path: str) -> dict[str, tuple[str, tuple[str, str] | None]]:
    """Node id after the file -> (outcome, failure): expected failures and exclusions as
    `outcome:class`; a failed test's failure as (message, text)."""
    cases, module = {}, path.removesuffix(".py").replace("/", ".")
    for case in ET.parse(xml).getroot().iter("testcase"):
        # classname: the module's dotted path, then any classes (dotted too)
        classes = case.get("classname", "").removeprefix(module).strip(".")
        rest = "::".join([*(classes.split(".") if classes else []), case.get("name")])
        skipped = case.find("skipped")
        message = skipped.get("message", "") if skipped is not None else ""
        if skipped is not None and COLLECTION_XFAIL in (skipped.text or ""):
            # a module import that failed for a known reason (plugin.py)
            message = (skipped.text or "").split(COLLECTION_XFAIL, 1)[1].strip()
            skipped.set("type", "pytest.xfail")
        found = CLASS_IN_REASON.match(message)
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        failure = None
        if bad is not None:
            outcome, failure = "failed", (bad.get("message") or "", bad.text or "")
        elif skipped is not None and skipped.get("type") == "pytest.xfail":
            outcome = f"xfailed:{found.group(1) if found else '?'}"
        elif skipped is not None and message.startswith("excluded ["):
            outcome = f"excluded:{found.group(1)}"
        elif skipped is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        cases[rest] = (outcome, failure)
    return cases


def parse_junit(xml: Path, path: str, entry: dict | None = None) -> dict[str, str]:
    """Test id -> outcome (`junit_cases`); with `entry`, re-judged under that allow-list
    entry (`reapply`)."""
    return {f"{path}::{rest}": reapply(entry, rest, o, f) if entry is not None else o
            for rest, (o, f) in junit_cases(xml, path).items()}


def outcome_counts(tests: dict[str, str]) -> Counter:
    return Counter(o.split(":")[0] for o in tests.values())


def _print_result(r: dict) -> dict:
    counts = outcome_counts(r["tests"])
    print(f"{r['path']}: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o])
          + f" ({r['seconds']} s)", flush=True)
    for test, outcome in sorted(r["tests"].items()):
        if outcome == "failed":
            print(f"    FAILED {test}: {r['failures'].get(test, '')[:160]}", flush=True)
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="run only these files (paths under tests/)")
    ap.add_argument("--slice", choices=("full", "ci"),
                    default=os.environ.get("UPSTREAM", "full"))
    ap.add_argument("-j", "--jobs", type=int, default=1, help="files run at once")
    ap.add_argument("--timeout", type=int, default=FILE_TIMEOUT_S,
                    help="seconds one test may take; a whole file, 3 times that")
    ap.add_argument("--report", type=Path, help="write the per-directory table here")
    ap.add_argument("--reuse", action="store_true",
                    help="run nothing: report each file's last stored result")
    ap.add_argument("--missing", action="store_true",
                    help="run only the files with no stored result (a run spanning sessions)")
    args = ap.parse_args(argv)

    rules = allowlist.load()
    chosen = args.files or rules.files_to_run(ci=args.slice == "ci")
    if args.missing:
        chosen = [f for f in chosen if store.load(f) is None]
    stored = {f: stored_result(f, rules.entry(f)) for f in chosen} if args.reuse else {}
    missing = [f for f in chosen if not stored[f]] if args.reuse else []
    if args.reuse:
        if missing:
            print(f"no stored result yet for {len(missing)} files (not in the report): "
                  + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
        chosen = []
    prepare_sources()
    prepare_site()
    # the whole hub (built once, kept in build/): a file's helpers and conftests name ids
    # its own text does not, so a file run alone meets what it meets in a full run; the
    # CI slice builds only the ids its files name, to stay in its time budget
    hub.build_all(sorted({h for f in chosen for h in hub.used_by((SRC / f).read_text())})
                  if args.slice == "ci" else None)

    _commit()
    start, results = time.time(), [r for r in stored.values() if r]
    keep = args.slice != "ci"
    # files whose tests hold wall-clock budgets run after the others, one at a time
    alone = [f for f in chosen if rules.entry(f).get("alone")]
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_file, f, rules.entry(f), args.timeout, keep)
                   for f in chosen if f not in alone]
        for fut in cf.as_completed(futures):
            results.append(_print_result(fut.result()))
    for f in alone:
        results.append(_print_result(run_file(f, rules.entry(f), args.timeout, keep)))
    wall = sum(r["seconds"] for r in results) if args.reuse else time.time() - start
    results.sort(key=lambda r: r["path"])
    (WORK / f"last-{args.slice}.json").write_text(json.dumps(
        {"slice": args.slice, "wall_s": round(wall, 1), "files": results}, indent=1))
    if args.report:
        from upstream_tests.report import write

        write(args.report, results, rules, wall, reused=args.reuse, slice_name=args.slice,
              missing=len(missing))
    total = sum((outcome_counts(r["tests"]) for r in results), Counter())
    print("= " + ", ".join(f"{total[o]} {o}" for o in OUTCOMES if total[o] or o == "failed")
          + f" in {len(results)} files, {wall:.1f}s =")
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
