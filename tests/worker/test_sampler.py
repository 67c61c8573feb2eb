"""The simulated NPU's greedy argmax (csrc/sim_index.c) against torch.argmax."""
from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.sampler import Sampler

from vllm_npu.ops.sim import index_kernels, native
from vllm_npu.worker.sampler import SimSampler, use_sim_sampler


@pytest.mark.parametrize("cols", [1, 15, 16, 17, 408, 1000])
def test_argmax_equals_torch_with_ties_nan_and_infinities(cols):
    assert native.library() is not None, "the native library was not built"
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(40, cols + 5, generator=g)[:, 2:cols + 2]  # rows cols + 5 apart
    x[1] = 3.0                                    # all tied: the first
    x[2, cols // 2:] = float("inf")               # ties at +inf
    x[3] = float("-inf")                          # all -inf: 0
    x[4, cols - 1] = float("nan")                 # NaN wins over any number
    x[5, cols // 3] = float("nan")
    x[5, cols - 1] = float("nan")                 # the first NaN
    x[6] = torch.randint(0, 3, (cols,), generator=g).float()  # many ties
    x[7, 0] = -0.0
    x[7, 1:] = -1.0
    x[8] = torch.round(x[8] * 2)                  # ties within and across vectors
    got = index_kernels.argmax_rows(x)
    assert got is not None and got.dtype == torch.int64
    assert got.tolist() == torch.argmax(x, dim=-1).tolist()


def test_argmax_leaves_other_cases_to_torch():
    x = torch.randn(4, 32)
    assert index_kernels.argmax_rows(x.half()) is None
    assert index_kernels.argmax_rows(x.t()) is None           # columns not adjacent
    assert index_kernels.argmax_rows(x[0]) is None            # not 2-D
    assert index_kernels.argmax_rows(x[:, :0]) is None        # no columns
    assert SimSampler.greedy_sample(x.half()).tolist() == x.half().argmax(-1).tolist()


def test_sampler_object_becomes_the_simulated_one_in_place():
    sampler = Sampler()
    use_sim_sampler(sampler)
    assert type(sampler) is SimSampler
    x = torch.randn(6, 50)
    assert sampler.greedy_sample(x).tolist() == x.argmax(-1).tolist()
