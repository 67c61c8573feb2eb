"""The CPU cores each simulated NPU computes with.

vLLM keeps torch at one intra-op thread for the host's serving loop (a GPU's host needs no
more). On the simulated NPU the device's work runs on the host CPUs too, so the simulator
gives it its own share of them: the native kernels' threads (csrc/sim_kernels.c, on
torch's OpenMP team) and torch's threads during eager forwards (prefill) and a graph
replay's matmuls.

Share: `NPU_SIM_CORES` if set, else this process's CPUs divided by the ranks on this host
(TP x PP x local DP), at least 1, so that ranks sharing a host do not oversubscribe it.
A graph replay (decode) runs its matmuls on them and its other ops on vLLM's single torch
thread (elementwise ops of a decode batch are below torch's parallel grain; with every op
at two threads whole runs were slower). The OpenMP workers then spin between the replay's
matmuls, and the attention kernel runs on that awake team: 128 x (128 + 128) and 64 x
(512 + 128) 4-5% faster (in one process) than matmuls on one thread and the kernel on a
pool of its own (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

import torch

from vllm_npu import envs

_ranks_on_host = 1


def set_ranks_on_host(n: int) -> None:
    """Called by the worker at startup with how many ranks share this host."""
    global _ranks_on_host
    _ranks_on_host = max(1, int(n))
    device_cores.cache_clear()


@functools.cache
def device_cores() -> int:
    return envs.NPU_SIM_CORES.get() or max(1, len(os.sched_getaffinity(0)) // _ranks_on_host)


@contextlib.contextmanager
def device_compute_threads() -> Iterator[None]:
    """torch's intra-op threads = the device's cores inside (restored after)."""
    before, wanted = torch.get_num_threads(), device_cores()
    if wanted == before:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(before)
