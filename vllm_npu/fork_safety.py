"""Before vLLM starts an engine core or workers from this process: fork or spawn.

vLLM forks its engine core and TP/PP/DP workers unless told to spawn; it forces spawn
itself only for CUDA / XPU initialised in the parent (vllm/utils/system_utils.py
`_maybe_force_spawn`), a check that does not know the NPU. The rules here, applied from
the platform's check_and_update_config (before any process starts):
- the NPU initialised in this process (an engine ran here before, in-process): a forked
  child cannot use it. torch_npu's `_lazy_init` raises "Cannot re-initialize NPU in
  forked subprocess. To use NPU with multiprocessing, you must use the 'spawn' start
  method" in a child forked after initialisation (torch_npu/npu/__init__.py: `_after_fork`
  marks the child, as torch.cuda does); vllm-ascend users meet it as #3133 (TP on 910C,
  worker processes) and vLLM-Omni's EngineCore. So workers spawn, as vLLM does for CUDA.
  The simulated NPU keeps the same rule (`claim_simulated_npu`, called where a worker
  would set its device): a worker forked from a process that initialised it raises
  torch_npu's error.
- numba's GNU OpenMP thread pool (vLLM's n-gram proposer runs numba parallel loops): a
  forked child that uses it prints "Terminating: fork() called from a process already
  using GNU OpenMP, this is unsafe." and exits 0, which the executor reports as a dead
  worker. Workers spawn.
- a gloo process group of an earlier engine left in a reference cycle: a forked child's
  first gc.collect() finalised it, joining threads only the parent has, and the worker
  hung. Collected here before any fork.
"""
from __future__ import annotations

import gc
import logging
import os
import sys

logger = logging.getLogger("vllm.npu")

BAD_FORK = ("Cannot re-initialize NPU in forked subprocess. To use NPU with "
            "multiprocessing, you must use the 'spawn' start method")

_simulated_npu_pid: int | None = None  # the process that initialised the simulated NPU


def claim_simulated_npu() -> None:
    """The simulated NPU's runtime initialisation (torch.npu.set_device's on a device)."""
    global _simulated_npu_pid
    if _simulated_npu_pid not in (None, os.getpid()):
        raise RuntimeError(BAD_FORK)
    _simulated_npu_pid = os.getpid()


def npu_initialized_here(simulated: bool) -> bool:
    if simulated:
        return _simulated_npu_pid == os.getpid()
    torch = sys.modules.get("torch")
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_initialized())


def numba_openmp_in_use() -> bool:
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    try:
        return numba.threading_layer() == "omp"
    except ValueError:  # no parallel region has run in this process
        return False


def prepare_to_fork_workers(simulated: bool, starts_processes: bool) -> None:
    """`starts_processes`: vLLM will start an engine core or workers from this process."""
    if not starts_processes or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
        return
    reasons = []
    if npu_initialized_here(simulated):
        reasons.append("the NPU is initialised in this process (an earlier engine ran "
                       "here): a forked child cannot use it")
    if numba_openmp_in_use():
        reasons.append("numba's GNU OpenMP pool runs in this process (an earlier n-gram "
                       "engine): forked children using it exit")
    if reasons:
        logger.warning("vllm_npu: workers spawn instead of forking (as vLLM does once CUDA "
                       "is initialised): %s", "; ".join(reasons))
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    else:
        gc.collect()  # children fork: nothing of an earlier engine may be left to collect
