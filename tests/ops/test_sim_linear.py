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


@pytest.mark.parametrize("rows,out_dim,in_dim", [(128, 256, 128), (7, 408, 128), (1, 5, 3),
                                                 (129, 96, 40), (9, 30, 32), (17, 48, 7),
                                                 (8, 16, 256), (64, 408, 128), (33, 40, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("kmajor", [False, True])
def test_replayed_linear_on_the_device_cores_matches_linear(rows, out_dim, in_dim, with_bias,
                                                             kmajor, monkeypatch):
    """A replay's linear on 1, 2 and 3 cores (csrc/sim_gemm.c, output columns split: where
    the inner dim is whole vectors of 16, dot products below 32 rows and multiply-adds on
    panels of w^T packed per call from 32 (the last panel partial where N is not whole
    panels), multiply-adds on a K-major weight whose N is whole vectors; otherwise MKL's
    sgemm per part of at least 16 rows; on torch's OpenMP team) writes the captured output
    equal to F.linear within float32 rounding, torch left at its one thread. A K-major weight whose N is not whole vectors is refused by
    the kernel (nothing written) and computed by aten's linear.out."""
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")
    x, w = _randn(rows, in_dim, seed=8), _randn(out_dim, in_dim, seed=9)
    if kmajor:  # the device's layout of a linear weight (layers/linear.py)
        w = w.t().contiguous().t()
    b = _randn(out_dim, seed=10) if with_bias else None
    covered = not kmajor or out_dim % 16 == 0
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = F.linear(x, w, b)
        for cores in (1, 2, 3):
            out = torch.full((rows, out_dim), float("nan"))
            if not covered:
                assert not native.linear(x, w, b, out, cores)
                assert out.isnan().all()
            else:
                assert native.linear(x, w, b, out, cores)
                torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-5)
            monkeypatch.setattr(sim_linear.cores, "device_cores", lambda n=cores: n)
            out.fill_(float("nan"))
            assert sim_linear.replay_linear_into(x, w, b, out=out) is out
            torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-5)
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_replayed_linear_outside_the_kernel_is_aten_linear(monkeypatch):
    """What the native split does not take (bf16, a non-contiguous input) is aten's
    linear.out, written into the output all the same; nothing is written on a refusal."""
    from vllm_npu.ops.sim import native

    monkeypatch.setattr(sim_linear.cores, "device_cores", lambda: 2)
    w = _randn(24, 16, seed=11)
    for x, weight in ((_randn(16, 9, seed=12).t(), w),
                      (_randn(9, 16, seed=13).bfloat16(), w.bfloat16())):
        out = torch.zeros(9, 24, dtype=x.dtype)
        assert not native.linear(x, weight, None, out, 2)
        assert torch.equal(out, torch.zeros_like(out))
        assert sim_linear.replay_linear_into(x, weight, out=out) is out
        torch.testing.assert_close(out, F.linear(x, weight))


@pytest.mark.parametrize("shape", [(128, 128), (7, 128), (2, 5, 128)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_logits_projection_runs_on_the_device_cores(shape, with_bias, monkeypatch):
    """`device_linear` (vLLM's logits projection, called outside the model's forward on the
    host's one torch thread): F.linear's result, computed on the device's cores (rows
    split natively, else aten with torch's threads at the cores), torch's threads restored."""
    from vllm_npu.ops.sim import native

    monkeypatch.setattr(sim_linear.cores, "device_cores", lambda: 2)
    x, w = _randn(*shape, seed=14), _randn(408, 128, seed=15)
    b = _randn(408, seed=16) if with_bias else None
    threads, split = [], []
    real_linear, real_native = sim_linear.linear, native.linear
    monkeypatch.setattr(sim_linear, "linear",
                        lambda *a: threads.append(torch.get_num_threads()) or real_linear(*a))
    monkeypatch.setattr(native, "linear", lambda *a: split.append(a[-1]) or real_native(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = F.linear(x, w, b)
        got = sim_linear.device_linear(x, w, b)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    natively = len(shape) == 2 and native.library() is not None
    assert split == ([2] if len(shape) == 2 else [])
    assert threads == ([] if natively else [2])


def test_the_device_weight_layout_is_k_major_where_the_matmul_takes_it():
    """`device_weight_layout` (run after vLLM's weight processing) keeps a float32 weight
    whose N is whole vectors of 16 K-major, the same [N, K] tensor and values; others as
    they are. A replay's linear on the re-laid weight equals F.linear on the original."""
    from vllm_npu.layers.linear import device_weight_layout
    from vllm_npu.ops.sim import native

    for shape, dtype, relaid in (((48, 32), torch.float32, True), ((40, 32), torch.float32,
                                  False), ((48, 32), torch.bfloat16, False)):
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(_randn(*shape, seed=14).to(dtype),
                                          requires_grad=False)
        before, param = layer.weight.detach().clone(), layer.weight
        device_weight_layout(layer)
        assert layer.weight is param and torch.equal(layer.weight, before)
        assert layer.weight.is_contiguous() is not relaid
        assert layer.weight.t().is_contiguous() is relaid
        device_weight_layout(layer)  # again (a reload): the layout stays
        assert layer.weight.t().is_contiguous() is relaid
    if native.library() is not None:
        x = _randn(9, 32, seed=15)
        out = torch.empty(9, 48)
        w = _randn(48, 32, seed=14)
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
        device_weight_layout(layer)
        assert native.linear(x, layer.weight, None, out, 2)
        torch.testing.assert_close(out, F.linear(x, w), rtol=1e-6, atol=1e-5)
