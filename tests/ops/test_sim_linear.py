"""The simulated device's matmul (`ops/sim/linear.py`) against `F.linear`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import linear as sim_linear


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(2048, 128), (3, 700, 256), (1024, 96)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_prefill_sized_inputs_match_f_linear(shape, with_bias):
    """oneDNN from 1,024 rows (incl. a 3-D and a non-contiguous input): within float32
    rounding of F.linear."""
    x = _randn(*shape, seed=1)
    w = _randn(320, shape[-1], seed=2)
    b = _randn(320, seed=3) if with_bias else None
    want = F.linear(x, w, b)
    for inp in (x, x.transpose(-1, -2).contiguous().transpose(-1, -2)):
        got = sim_linear.linear(inp, w, b)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_decode_sized_and_other_dtypes_are_f_linear(mocker):
    onednn = mocker.spy(torch.ops.mkldnn, "_linear_pointwise")
    w = _randn(64, 32, seed=4)
    for x, weight in ((_randn(1023, 32, seed=5), w),            # below 1,024 rows
                      (_randn(2048, 32, seed=6).double(), w.double())):
        assert torch.equal(sim_linear.linear(x, weight), F.linear(x, weight))
    assert onednn.call_count == 0
    x = _randn(32, seed=7).expand(2048, 32)  # a broadcast view of 2,048 rows: oneDNN
    torch.testing.assert_close(sim_linear.linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-5)
    assert onednn.call_count == 1


def test_without_onednn_everything_is_f_linear(monkeypatch):
    monkeypatch.setattr(sim_linear, "_onednn", lambda: False)
    x, w = _randn(4096, 64, seed=8), _randn(48, 64, seed=9)
    assert torch.equal(sim_linear.linear(x, w), F.linear(x, w))
