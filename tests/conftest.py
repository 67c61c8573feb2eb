"""Shared fixtures: tiny local models (no hub) and the backend the tests run on."""
from __future__ import annotations

import os
from pathlib import Path

# Offline LLM tests run the engine in-process: much faster to start, same code paths.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Every connection the tests make (process groups, engine message queues) stays on loopback.
os.environ["VLLM_HOST_IP"] = "127.0.0.1"
# No usage reports: each engine would start a thread posting to vLLM's stats server.
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

# Under `pytest -n N` (make test runs two workers: tests/helpers/scheduling.py) each worker
# and what it starts computes with its share of the cores, as ranks sharing a host do: the
# simulated NPU's threads (NPU_SIM_CORES, vllm_npu/ops/sim/cores.py; inherited by servers
# and engine workers) and torch's intra-op threads in the worker (set by
# _freeze_the_imports). Both at the host's default, the two workers' engines oversubscribed
# the cores: the suite took 1,638 s, not 1,473 s (one cold run each, 2026-12-07).
# And each simulated NPU has 2 GiB, not the simulator's default 4: an engine's KV cache
# takes 0.92 of it (gpu_memory_utilization) and is zeroed, so host memory. Two workers'
# served engines at 4 GiB reached 22 GB of this 24 GB machine and the kernel killed a DP
# worker of test_moe_parity (measured 2026-12-07); tests that size memory set their own.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CORE_SHARE = max(1, len(os.sched_getaffinity(0)) // WORKERS)
if WORKERS > 1:
    os.environ.setdefault("NPU_SIM_CORES", str(CORE_SHARE))
    os.environ.setdefault("NPU_SIM_MEMORY_GB", "2")

import gc  # noqa: E402

import pytest  # noqa: E402

# vLLM collects the whole heap about eight times per engine (freeze_gc_heap at start-up,
# around graph capture, after the profile run, cleanup_dist_env_and_memory at shutdown)
# and unfreezes it each time: frees GPU memory held by cycles. In one long pytest process
# the heap is ~0.8M objects of imports plus what earlier tests keep (cached HF references,
# Dynamo's caches; 1.9M after test_architectures), so each full collection took 0.5-1.1 s:
# measured, 45-60% of an engine test's time. Here, what survives a test module is
# collected once and frozen for good (`_freeze_what_survives_each_module`), and vLLM's
# freeze / unfreeze are no-ops in this process, so its collections scan only the objects
# made since; engines in other processes (TP workers, servers) keep vLLM's behaviour.
# `real_gc_freeze` gives a test the real pair back.
REAL_GC_FREEZE, REAL_GC_UNFREEZE = gc.freeze, gc.unfreeze
gc.freeze = gc.unfreeze = lambda: None


@pytest.fixture(scope="session", autouse=True)
def _freeze_the_imports():
    """The libraries every engine test imports, loaded and frozen before the first test."""
    import torch
    import transformers  # noqa: F401
    import vllm.entrypoints.llm  # noqa: F401

    if WORKERS > 1:
        torch.set_num_threads(CORE_SHARE)

    _RESTORE_HF_CONFIGS.append(_pristine_hf_config_registry())
    gc.collect()
    REAL_GC_FREEZE()


def _pristine_hf_config_registry():
    """vLLM 0.33 renames HF's DeepseekV3Config to 'deepseek_v32' and registers it with
    AutoConfig under that name once it loads a DeepSeek-V3.2 checkpoint
    (transformers_utils/config.py `_register_config_class`, process-wide): afterwards a
    tiny DeepSeek-V3 checkpoint is written as deepseek_v32 and HF loads a DeepSeek-V3.2
    reference as DeepSeek-V3 (no indexer). Returns a function that puts both back."""
    from transformers import DeepseekV3Config
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, extra = DeepseekV3Config.model_type, dict(CONFIG_MAPPING._extra_content)

    def restore() -> None:
        DeepseekV3Config.model_type = model_type
        CONFIG_MAPPING._extra_content.clear()
        CONFIG_MAPPING._extra_content.update(extra)
    return restore


_RESTORE_HF_CONFIGS = []


@pytest.fixture(autouse=True)
def _hf_configs_as_transformers_defines_them():
    """Each test (and its HF reference) sees transformers' own config registry."""
    for restore in _RESTORE_HF_CONFIGS:
        restore()
    yield
    for restore in _RESTORE_HF_CONFIGS:
        restore()


_START_METHOD = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")  # as pytest was started


@pytest.fixture(autouse=True)
def _worker_start_method_per_test():
    """This process initialises the (simulated) NPU in its first in-process engine; from
    then on the platform makes vLLM spawn the processes an engine here starts, as it must
    on a device (vllm_npu/fork_safety.py), by setting VLLM_WORKER_MULTIPROC_METHOD. That
    holds within the test; later tests start from the method pytest was started with
    (their servers are fresh processes)."""
    yield
    if _START_METHOD is None:
        os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    else:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = _START_METHOD


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_survives_each_module():
    yield
    _no_engine_state_left()
    gc.collect()
    REAL_GC_FREEZE()


def _no_engine_state_left() -> None:
    """The next module starts without an in-process engine's process groups: an engine
    that failed to start, or was never shut down, leaves them, and the next engine of this
    process reuses them as they are (a MoE model then finds no expert-parallel group). The
    order of modules differs between the workers of `pytest -n`."""
    import sys

    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is not None and (state.model_parallel_is_initialized()
                              or state._WORLD is not None):
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


@pytest.fixture
def real_gc_freeze(monkeypatch):
    """vLLM's gc.freeze / gc.unfreeze as they are outside the test process."""
    monkeypatch.setattr(gc, "freeze", REAL_GC_FREEZE)
    monkeypatch.setattr(gc, "unfreeze", REAL_GC_UNFREEZE)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_model import ARCHS, build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {arch: build_tiny_model(str(root / f"tiny-{arch}"), arch=arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def simulated() -> bool:
    from vllm_npu.device import select_backend

    return select_backend().simulated


@pytest.fixture(scope="session")
def parity_dtype(simulated) -> str:
    """The dtype engines are checked against HF in (tests/helpers/reference.parity_dtype):
    float32 on the simulated NPU, where parity is token-exact; the device's bfloat16 on a
    device, where hf_greedy's reference runs in bfloat16 and accepts a divergence at a near
    tie. VLLM_NPU_TEST_DTYPE=bfloat16 runs the device's way on the simulator."""
    from tests.helpers.reference import parity_dtype as dtype

    if dtype() == "float32" and not simulated:
        pytest.fail("VLLM_NPU_TEST_DTYPE=float32: devices take bfloat16 / float16 only")
    return dtype()


@pytest.fixture(scope="session")
def float32_only(parity_dtype) -> str:
    """For checks of float32-exact values (logprobs to 1e-4, router counts, byte counts,
    float32 fake-quant references, statistics against float32 probabilities): skipped
    where the parity dtype is another."""
    if parity_dtype != "float32":
        pytest.skip(f"checks float32-exact values; the parity dtype here is {parity_dtype}")
    return parity_dtype


@pytest.fixture
def single_torch_thread():
    """Tiny-shape CPU tests run torch single-threaded: intra-op threads buy nothing there,
    and on a busy 2-core machine contending OpenMP workers make each op ~10x slower.
    The previous thread count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Small-shape unit tests of ops, layers and attention backends run single-threaded.
SINGLE_THREAD_DIRS = {"ops", "layers", "attention"}


@pytest.fixture(autouse=True)
def _small_shapes_single_threaded(request):
    top = Path(request.node.path).relative_to(Path(__file__).parent).parts[0]
    if top in SINGLE_THREAD_DIRS:
        request.getfixturevalue("single_torch_thread")
    yield


_tail: list[str | None] = [None]  # node id of the first test of the single-threaded tail
_prefill: list = []  # the process filling vLLM's model-info cache (tests/helpers/model_info.py)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.helpers.scheduling import FileScheduling

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if WORKERS > 1:  # the order in which the workers get the files (tests/helpers/scheduling.py)
        from tests.helpers.scheduling import order

        order(items)


def pytest_configure(config):
    from tests.helpers import background

    if background.parallel_controller(config):
        from vllm_npu.device import select_backend

        if not select_backend().simulated:  # each worker's engines would take every NPU
            raise pytest.UsageError(
                f"-n {config.option.numprocesses}: on NPUs the suite runs in one process "
                "(make test TEST_WORKERS=0); parallel workers are for the simulated NPU")


def pytest_sessionstart(session):
    from tests.helpers import background

    if background.parallel_controller(session.config):
        background.tell_the_tail_file()  # no single-threaded tail: what waits for it can start


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    from tests.helpers import background

    if not session.config.option.collectonly:
        _tail[0] = background.tail_start([item.nodeid for item in session.items])
        if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
            return  # one worker fills the shared cache
        if any(item.nodeid.startswith(background.ENGINE_DIRS) for item in session.items):
            from tests.helpers import model_info

            # vLLM's model-info cache, filled beside the first tests
            _prefill.append(model_info.start())


def pytest_runtest_logstart(nodeid, location):
    if nodeid == _tail[0]:  # one core idles from here on: start the background runs
        from tests.helpers import background

        background.start_all()

