"""The CPU cores each simulated NPU computes with.

vLLM keeps torch at one intra-op thread for the host's serving loop (a GPU's host needs no
more). On the simulated NPU the device's work runs on the host CPUs too, so the simulator
gives it its own share of them: the native kernels' threads (csrc/sim_kernels.c) and
torch's threads during eager forwards (prefill), where large matmuls use them.

Share: `NPU_SIM_CORES` if set, else this process's CPUs divided by the ranks on this host
(TP x PP x local DP), at least 1, so that ranks sharing a host do not oversubscribe it.
Graph replays (decode) keep vLLM's single torch thread: their matmuls are too small to
gain, and idle OpenMP workers spinning after each op would take a core from the kernels.
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
def eager_compute_threads() -> Iterator[None]:
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
