"""Before vLLM's multiprocessing executor forks its workers from this process.

vLLM forks TP/PP/DP workers unless told to spawn (its default where no CUDA is initialised,
as on the simulated NPU): a child starts with this process's heap and libraries' state but
only the forking thread. Two things an earlier engine in the same process leaves behind
broke forked workers (both seen: a script or test running an in-process engine, then a
TP=2 one):
- a gloo process group in a reference cycle: the child's first gc.collect() finalised it,
  joining threads only this process has, and the worker hung in load_model. Collected here.
- numba's GNU OpenMP thread pool (vLLM's n-gram proposer runs numba parallel loops): a
  child that uses it prints "Terminating: fork() called from a process already using GNU
  OpenMP, this is unsafe." and exits 0, which the executor reports as a dead worker. Then
  workers spawn, as vLLM itself decides when CUDA is initialised
  (vllm/utils/system_utils.py `_maybe_force_spawn`).
"""
from __future__ import annotations

import gc
import logging
import os
import sys

logger = logging.getLogger("vllm.npu")


def numba_openmp_in_use() -> bool:
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    try:
        return numba.threading_layer() == "omp"
    except ValueError:  # no parallel region has run in this process
        return False


def prepare_to_fork_workers() -> None:
    gc.collect()
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork") != "spawn" \
            and numba_openmp_in_use():
        logger.warning("vllm_npu: numba's GNU OpenMP pool runs in this process (an earlier "
                       "n-gram engine); forked workers would exit: workers spawn instead")
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
