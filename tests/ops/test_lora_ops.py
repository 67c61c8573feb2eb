"""Simulated multi-LoRA ops (bgmv / sgmv shrink and expand) vs per-row loops, and the
arguments they refuse."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import npu_bgmv_expand, npu_bgmv_shrink, npu_sgmv_expand, npu_sgmv_shrink
from vllm_npu.ops.sim.checks import NPUOpError


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_bgmv_shrink_is_each_rows_adapter_scaled_and_zero_without_one():
    x = torch.randn(5, 16, generator=_gen(0))
    a = torch.randn(3, 1, 4, 16, generator=_gen(1))  # [L, 1, r, H] as vLLM stacks it
    idx = torch.tensor([2, -1, 0, 0, 1])
    y = torch.full((5, 6), 7.0)  # columns past r are not written
    npu_bgmv_shrink(x, a, idx, y, 0.5)
    for t in range(5):
        want = torch.zeros(4) if idx[t] < 0 else 0.5 * (a[idx[t], 0] @ x[t])
        torch.testing.assert_close(y[t, :4], want)
    assert (y[:, 4:] == 7.0).all()


def test_bgmv_expand_adds_into_its_slice_only():
    x = torch.randn(4, 3, generator=_gen(2))
    b = torch.randn(2, 5, 3, generator=_gen(3))  # [L, slice, r]
    idx = torch.tensor([1, 0, -1, 1])
    y0 = torch.randn(4, 12, generator=_gen(4))
    y = y0.clone()
    npu_bgmv_expand(x, b, idx, y, 4, 5)
    for t in range(4):
        add = torch.zeros(5) if idx[t] < 0 else b[idx[t]] @ x[t]
        torch.testing.assert_close(y[t, 4:9], y0[t, 4:9] + add)
    torch.testing.assert_close(y[:, :4], y0[:, :4])
    torch.testing.assert_close(y[:, 9:], y0[:, 9:])


def test_sgmv_gives_each_segment_its_requests_adapter():
    x = torch.randn(7, 8, generator=_gen(5))
    a = torch.randn(2, 3, 8, generator=_gen(6))
    b = torch.randn(2, 8, 3, generator=_gen(7))
    idx, lens = torch.tensor([1, -1, 0]), torch.tensor([3, 2, 2])
    per_token = torch.repeat_interleave(idx, lens)
    mid = torch.zeros(7, 3)
    npu_sgmv_shrink(x, a, idx, lens, mid, 2.0)
    want_mid = torch.zeros(7, 3)
    npu_bgmv_shrink(x, a, per_token, want_mid, 2.0)
    torch.testing.assert_close(mid, want_mid)
    out = torch.zeros(7, 8)
    npu_sgmv_expand(mid, b, idx, lens, out, 0, 8)
    for t in range(7):
        want = torch.zeros(8) if per_token[t] < 0 else b[per_token[t]] @ mid[t]
        torch.testing.assert_close(out[t], want)


@pytest.mark.parametrize("call,match", [
    (lambda: npu_bgmv_shrink(torch.randn(2, 8), torch.randn(2, 3, 8), torch.tensor([0, 2]),
                             torch.zeros(2, 3), 1.0), r"-1 \(none\) or in \[0, 2\)"),
    (lambda: npu_bgmv_shrink(torch.randn(2, 8), torch.randn(2, 3, 8),
                             torch.tensor([0, 1], dtype=torch.int32), torch.zeros(2, 3), 1.0),
     "int64"),
    (lambda: npu_bgmv_shrink(torch.randn(2, 7), torch.randn(2, 3, 8), torch.tensor([0, 1]),
                             torch.zeros(2, 3), 1.0), r"x \[T, 8\]"),
    (lambda: npu_bgmv_expand(torch.randn(2, 3), torch.randn(2, 5, 3), torch.tensor([0, 1]),
                             torch.zeros(2, 8), 4, 5), r"slice \[4, 9\)"),
    (lambda: npu_sgmv_shrink(torch.randn(5, 8), torch.randn(2, 3, 8), torch.tensor([0, 1]),
                             torch.tensor([2, 2]), torch.zeros(5, 3), 1.0), "5 in all"),
    (lambda: npu_bgmv_shrink(torch.randn(2, 8), torch.randn(2, 2, 3, 8), torch.tensor([0, 1]),
                             torch.zeros(2, 3), 1.0), "needs 1 at dim 1"),
])
def test_lora_ops_refuse_bad_arguments(call, match):
    with pytest.raises(NPUOpError, match=match):
        call()
