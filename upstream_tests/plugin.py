"""pytest plugin: vLLM 0.33.0's own tests on the NPU platform (`-p upstream_tests.plugin`).

Everything the upstream tests assume about CUDA is changed here, in one place, and nowhere
in their sources:

- the NPU plugins load before `tests/conftest.py` imports vLLM, so the names it binds at
  import (e.g. `cleanup_dist_env_and_memory`) are the ones the plugin prepared;
- fixtures of `tests/conftest.py` that name CUDA are replaced as the conftest registers:
  `dist_init` initialises with the platform's process-group backend (not "nccl"), and
  `workspace_init` with the platform's device (it skipped the workspace when
  `torch.accelerator` had no device, which the simulated NPU never has);
- `VllmRunner`'s default block size is the NPU's paged-attention block (128): upstream
  picks it per platform (16 CUDA, 64 XPU, 128 CPU) and has no NPU branch; the NPU kernels
  take blocks of 128 (vllm_npu/platform.py cites the rule), so 16 is not weakened, it is
  the same per-platform default upstream gives every device it knows;
- the allow-list entry of the file being run (the runner passes it as
  `VLLM_NPU_UPSTREAM_ENTRY`) marks its tests: `expected-fail` ones xfail strictly, with
  their reason; `excluded` ones are skipped with their class and reason, so each is still
  counted by test id; a failure matching one of its `known_failures` (a regular
  expression, e.g. the platform's refusal of block size 16) is that expected failure;
- in tests/v1/kv_connector/unit the NPU's kernel block sizes are relaxed to multiples of
  16, as that directory's conftest relaxes the CPU backend's ("connector unit tests
  exercise transfer logic, never the attention kernel, and hard-code block_size=16");
  an engine the tests start in another process keeps the NPU's rule;
- a module-level `pytest.skip` the entry lifts (`lift_module_skip`: its reason matches,
  e.g. "V1 currently only supported on CUDA", a guard from before V1 ran on other
  platforms) does not skip: the module imports on and its tests run and count.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import re
import tempfile

import pytest

ENTRY_ENV = "VLLM_NPU_UPSTREAM_ENTRY"
NPU_TEST_BLOCK_SIZE = 128  # vllm_npu.platform PAGED_BLOCK_SIZES[0]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before tests/conftest.py is imported (pytest_configure would be too late)."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def _npu_dist_init():
    from tests.utils import ensure_current_vllm_config
    from vllm.distributed import (cleanup_dist_env_and_memory, init_distributed_environment,
                                  initialize_model_parallel)
    from vllm.platforms import current_platform

    fd, store = tempfile.mkstemp()
    os.close(fd)
    try:
        with ensure_current_vllm_config():
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"file://{store}",
                                         backend=current_platform.dist_backend)
            initialize_model_parallel(1, 1)
            yield
        cleanup_dist_env_and_memory()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(store)


def _npu_workspace_init():
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.worker.workspace import init_workspace_manager, reset_workspace_manager

    init_workspace_manager(torch.device(current_platform.device_type))
    yield
    reset_workspace_manager()


# conftest fixture name -> its NPU body (made a fixture under that name on registration)
FIXTURES = {"dist_init": _npu_dist_init, "workspace_init": _npu_workspace_init}


def _set_default(func, name: str, value) -> None:
    """Change the default of `func`'s parameter `name` (positional-or-keyword)."""
    params = [p for p in inspect.signature(func).parameters.values()
              if p.default is not inspect.Parameter.empty
              and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    names = [p.name for p in params]
    defaults = list(func.__defaults__)
    defaults[names.index(name)] = value
    func.__defaults__ = tuple(defaults)


@pytest.hookimpl(tryfirst=True)
def pytest_plugin_registered(plugin, manager):
    """Replace the CUDA-bound fixtures of vLLM's tests/conftest.py before pytest reads it."""
    if getattr(plugin, "__name__", None) != "tests.conftest":
        return
    for name, fixture in FIXTURES.items():
        if hasattr(plugin, name):
            setattr(plugin, name, pytest.fixture(name=name)(fixture))
    runner = getattr(plugin, "VllmRunner", None)
    if runner is not None:
        _set_default(runner.__init__, "block_size", NPU_TEST_BLOCK_SIZE)


# Directories whose own conftest relaxes the CPU attention backend's kernel block sizes
# because their tests never reach an attention kernel (the NPU's rule is relaxed alike).
KERNEL_FREE_DIRS = ("tests/v1/kv_connector/unit/",)


@pytest.fixture(autouse=True)
def _npu_kernel_block_sizes_relaxed(request):
    # Its own MonkeyPatch, not the `monkeypatch` fixture: an autouse fixture requesting that
    # makes it the first set up and the last torn down in every test, after the test's own
    # fixtures' teardown (test_cpu_resource_utils' autouse teardown then met the test's
    # monkeypatched function instead of vLLM's cached one).
    path = request.node.path.relative_to(request.config.rootpath).as_posix()
    if not path.startswith(KERNEL_FREE_DIRS):
        yield
        return
    from vllm.v1.attention.backend import MultipleOf

    import vllm_npu.platform as npu_platform
    from vllm_npu.attention.backend import NPUAttentionBackend
    from vllm_npu.attention.mla import NPUMLABackend

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(npu_platform, "PAGED_BLOCK_SIZES", tuple(range(16, 513, 16)))
        for backend in (NPUAttentionBackend, NPUMLABackend):
            patch.setattr(backend, "get_supported_kernel_block_sizes",
                          staticmethod(lambda kv_cache_spec=None: [MultipleOf(16)]))
        yield


@functools.cache
def _entry() -> dict:
    raw = os.environ.get(ENTRY_ENV)
    return json.loads(raw) if raw else {}


def _wildcard(key: str) -> re.Pattern:
    """`*` matches anything; everything else (brackets too) is literal."""
    return re.compile(".*".join(re.escape(part) for part in key.split("*")))


def rule_for_names(rest: str, name: str, rules: dict) -> dict | None:
    """The allow-list rule naming a test, from its node id after the file (`rest`) and its
    name with parameters: by `rest`, the name, or the function name (most specific
    first), then the first key with `*` wildcards matching the name (`test_x[*org/*]`)
    or the node id after the file (`TestA::TestB::*`)."""
    for key in (rest, name, name.split("[", 1)[0]):
        if key in rules:
            return rules[key]
    for key, rule in rules.items():
        if "*" in key and (_wildcard(key).fullmatch(name) or _wildcard(key).fullmatch(rest)):
            return rule
    return None


def rule_for(item, rules: dict) -> dict | None:
    return rule_for_names(item.nodeid.split("::", 1)[-1], item.name, rules)


def known_failure(text: str, entry: dict) -> dict | None:
    """The first of the entry's known failures whose pattern the failure text matches."""
    for known in entry.get("known_failures", ()):
        if re.search(known["match"], text):
            return known
    return None


def _known_failure(report) -> dict | None:
    return known_failure(str(report.longrepr), _entry())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure whose text matches a known failure of the allow-list counts as that
    expected failure (xfail, with its class and reason); any other failure stays one."""
    report = yield
    known = _known_failure(report) if report.failed else None
    if known:
        report.outcome = "skipped"
        report.wasxfail = f"[{known['class']}] {known['reason']}"
    return report


COLLECTION_XFAIL = "expected-fail at collection"


@contextlib.contextmanager
def _module_skip_lifted(lift: dict | None):
    """While a module imports: `pytest.skip(reason, allow_module_level=True)` with a
    reason matching `lift['match']` returns instead of raising (the module's guard is
    an `if`, so its import goes on); any other skip is pytest's."""
    if not lift:
        yield
        return
    original = pytest.skip

    @functools.wraps(original)
    def skip(reason: str = "", *, allow_module_level: bool = False):
        if allow_module_level and re.search(lift["match"], reason):
            return None
        return original(reason, allow_module_level=allow_module_level)

    pytest.skip = skip
    try:
        yield
    finally:
        pytest.skip = original


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module that fails to import for a known reason (e.g. a hub tokenizer loaded at
    import) is that expected failure too; pytest has no xfail for collection, so it is
    skipped with a reason the runner reads back as one."""
    lift = _entry().get("lift_module_skip") if isinstance(collector, pytest.Module) else None
    with _module_skip_lifted(lift):
        report = yield
    known = _known_failure(report) if report.failed else None
    if known:
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0,
                           f"{COLLECTION_XFAIL} [{known['class']}] {known['reason']}")
    return report


def pytest_collection_modifyitems(config, items):
    entry = _entry()
    rules = entry.get("tests", {})
    for item in items:
        rule = rule_for(item, rules) or entry
        mode = rule.get("mode", "must-pass")
        why = f"[{rule.get('class', '?')}] {rule.get('reason', '')}"
        if mode == "excluded":
            item.add_marker(pytest.mark.skip(reason=f"excluded {why}"))
        elif mode == "expected-fail":
            item.add_marker(pytest.mark.xfail(strict=True, reason=why))
