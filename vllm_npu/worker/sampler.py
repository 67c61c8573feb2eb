"""The sampler on the simulated NPU: vLLM's, with its greedy argmax as one native call.

vLLM's `Sampler.greedy_sample` is `logits.argmax(dim=-1)` on every platform but vLLM's CPU
one (which has a C++ kernel); on the simulated NPU that is torch's scalar CPU reduction,
~70 us a step for 128 rows of 408 logits on the host's one thread. `index_kernels.
argmax_rows` gives the same indices (first maximum, first NaN) in a few microseconds; a
real NPU keeps vLLM's argmax (torch_npu's ArgMaxV2 on the device).
"""
from __future__ import annotations

import torch
from vllm.v1.sample.sampler import Sampler

from vllm_npu.ops.sim import index_kernels


class SimSampler(Sampler):

    @staticmethod
    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        out = index_kernels.argmax_rows(logits)
        return Sampler.greedy_sample(logits) if out is None else out


def use_sim_sampler(sampler: Sampler) -> None:
    """Make vLLM's sampler object the simulated NPU's in place: the runner and its
    rejection sampler (speculative decoding) hold the same object."""
    if type(sampler) is Sampler:
        sampler.__class__ = SimSampler
