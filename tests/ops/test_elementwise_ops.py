"""Simulated elementwise NPU ops (rms_norm, add_rms_norm, swiglu, rotary_mul) against
references written here in plain float32 PyTorch, plus the argument refusals."""
from __future__ import annotations

import math

import pytest
import torch

from vllm_npu.ops.sim import npu_add_rms_norm, npu_rms_norm, npu_rotary_mul, npu_swiglu
from vllm_npu.ops.sim.checks import NPUOpError

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- rms_norm


def _ref_rms(x: torch.Tensor, gamma: torch.Tensor, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * gamma over gamma's trailing dims, all in float32."""
    xf = x.float()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    ms = (xf * xf).sum(dim=dims, keepdim=True) / math.prod(gamma.shape)
    rstd = 1.0 / torch.sqrt(ms + eps)
    return xf * rstd * gamma.float(), rstd


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 64), (3, 7), (2, 3, 33)])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_matches_reference(dtype, shape, eps):
    g = _gen(1)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    gamma = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    y, rstd = npu_rms_norm(x, gamma, epsilon=eps)
    ref_y, ref_rstd = _ref_rms(x, gamma, eps)
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32
    assert rstd.shape == (*shape[:-1], 1)
    _close(y, ref_y, dtype)
    torch.testing.assert_close(rstd, ref_rstd, atol=1e-6, rtol=1e-5)


def test_rms_norm_epsilon_is_used():
    # All-zero rows: rstd must be exactly 1/sqrt(eps), output exactly zero.
    x = torch.zeros(2, 16)
    gamma = torch.ones(16)
    y, rstd = npu_rms_norm(x, gamma, epsilon=0.25)
    torch.testing.assert_close(rstd, torch.full((2, 1), 2.0))
    assert torch.equal(y, torch.zeros(2, 16))


def test_rms_norm_output_has_unit_rms_with_unit_gamma():
    x = torch.randn(4, 128, generator=_gen(2)) * 10 + 3
    y, _ = npu_rms_norm(x, torch.ones(128), epsilon=0.0)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(4), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_two_dim_gamma_normalises_trailing_dims(dtype):
    g = _gen(3)
    x = torch.randn(3, 4, 8, generator=g).to(dtype)
    gamma = (torch.rand(4, 8, generator=g) + 0.5).to(dtype)
    y, rstd = npu_rms_norm(x, gamma, epsilon=1e-6)
    ref_y, ref_rstd = _ref_rms(x, gamma, 1e-6)
    assert rstd.shape == (3, 1, 1)
    _close(y, ref_y, dtype)
    torch.testing.assert_close(rstd, ref_rstd, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (6, 40), (2, 5, 9)])
def test_add_rms_norm_matches_reference(dtype, shape):
    g = _gen(4)
    x1 = torch.randn(shape, generator=g).to(dtype)
    x2 = torch.randn(shape, generator=g).to(dtype)
    gamma = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    y, rstd, xsum = npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6)
    # The residual sum is returned in the input dtype, equal to x1 + x2 in that dtype.
    assert xsum.dtype == dtype
    assert torch.equal(xsum, x1 + x2)
    ref_y, ref_rstd = _ref_rms(x1 + x2, gamma, 1e-6)
    assert y.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == (*shape[:-1], 1)
    _close(y, ref_y, dtype)
    torch.testing.assert_close(rstd, ref_rstd, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 32), (128, 128), (7, 896), (4096, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_float32_rms_norm_matches_hf(shape, threads):
    """HF's RMSNorm module is the reference the model parity tests compare tokens with:
    float32 (one native pass, csrc/sim_rows.c) stays within 1e-6 relative of it, single-
    and multi-threaded (prefill runs with the device's cores; measured max 3.6e-7: the
    squares are summed in another order than torch's reduction); the residual sum is
    exact."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = _gen(11)
    x = torch.randn(shape, generator=g) * 4
    residual = torch.randn(shape, generator=g)
    hf = LlamaRMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.rand(shape[-1], generator=g) + 0.5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            y, _ = npu_rms_norm(x, hf.weight.detach(), epsilon=1e-6)
            y2, _, xsum = npu_add_rms_norm(x, residual, hf.weight.detach(), epsilon=1e-6)
            ref, ref2 = hf(x), hf(x + residual)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(y2, ref2, rtol=1e-6, atol=1e-7)
    assert torch.equal(xsum, x + residual)


def test_add_rms_norm_does_not_modify_inputs():
    x1 = torch.randn(3, 8, generator=_gen(5))
    x2 = torch.randn(3, 8, generator=_gen(6))
    c1, c2 = x1.clone(), x2.clone()
    npu_add_rms_norm(x1, x2, torch.ones(8))
    assert torch.equal(x1, c1) and torch.equal(x2, c2)


def test_rms_norm_refuses_int32():
    x = torch.ones(2, 8, dtype=torch.int32)
    with pytest.raises(NPUOpError, match=r"npu_rms_norm: x has dtype torch\.int32"):
        npu_rms_norm(x, torch.ones(8, dtype=torch.int32))


def test_rms_norm_refuses_gamma_dtype_mismatch():
    with pytest.raises(NPUOpError, match=r"npu_rms_norm: inputs must share one dtype"):
        npu_rms_norm(torch.ones(2, 8), torch.ones(8, dtype=torch.bfloat16))


@pytest.mark.parametrize("gshape", [(9,), (7,), (3, 8)])
def test_rms_norm_refuses_gamma_shape_mismatch(gshape):
    with pytest.raises(NPUOpError, match=r"gamma shape .* must match the trailing dims"):
        npu_rms_norm(torch.ones(2, 8), torch.ones(gshape))


def test_add_rms_norm_refuses_dtype_mismatch():
    with pytest.raises(NPUOpError, match=r"npu_add_rms_norm: inputs must share one dtype"):
        npu_add_rms_norm(torch.ones(2, 8), torch.ones(2, 8, dtype=torch.float16), torch.ones(8))


def test_add_rms_norm_refuses_shape_mismatch():
    with pytest.raises(NPUOpError, match=r"x1 \(2, 8\) and x2 \(1, 8\) differ in shape"):
        npu_add_rms_norm(torch.ones(2, 8), torch.ones(1, 8), torch.ones(8))


def test_add_rms_norm_refuses_int32():
    x = torch.ones(2, 8, dtype=torch.int32)
    with pytest.raises(NPUOpError, match=r"npu_add_rms_norm: x has dtype torch\.int32"):
        npu_add_rms_norm(x, x, torch.ones(8, dtype=torch.int32))


def test_add_rms_norm_refuses_gamma_shape_mismatch():
    with pytest.raises(NPUOpError, match=r"npu_add_rms_norm: gamma shape \(4,\)"):
        npu_add_rms_norm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(4))


# ------------------------------------------------------------------------------- swiglu


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,dim", [((4, 16), -1), ((1, 2), -1), ((3, 5, 22), -1),
                                       ((6, 7), 0), ((3, 10, 5), 1), ((2, 4, 3), -2)])
def test_swiglu_matches_reference(dtype, shape, dim):
    x = (torch.randn(shape, generator=_gen(7)) * 2).to(dtype)
    half = shape[dim] // 2
    a = x.float().narrow(dim, 0, half)
    b = x.float().narrow(dim, half, half)
    ref = a / (1 + torch.exp(-a)) * b
    out = npu_swiglu(x, dim=dim)
    expected_shape = list(shape)
    expected_shape[dim] = half
    assert out.shape == tuple(expected_shape)
    assert out.dtype == dtype
    _close(out, ref, dtype)


def test_swiglu_default_dim_is_last():
    x = torch.randn(4, 6, generator=_gen(8))
    torch.testing.assert_close(npu_swiglu(x), npu_swiglu(x, dim=-1), atol=0, rtol=0)
    assert npu_swiglu(x).shape == (4, 3)


def test_swiglu_refuses_int32():
    with pytest.raises(NPUOpError, match=r"npu_swiglu: x has dtype torch\.int32"):
        npu_swiglu(torch.ones(2, 4, dtype=torch.int32))


@pytest.mark.parametrize("shape,dim", [((2, 5), -1), ((3, 4), 0), ((1, 1), -1)])
def test_swiglu_refuses_odd_dim(shape, dim):
    with pytest.raises(NPUOpError, match=rf"npu_swiglu: dim {dim} of x .* must be even"):
        npu_swiglu(torch.ones(shape), dim=dim)


# ------------------------------------------------------------------------------- rotary


def _cos_sin(S: int, D: int, mode: str, dtype, base: float = 10000.0):
    """cos/sin tables [1, S, 1, D] in the layout each rotary mode expects."""
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)   # [D/2]
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]      # [S, D/2]
    if mode == "half":
        full = torch.cat((ang, ang), dim=-1)            # [a0..a_{D/2-1}, a0..a_{D/2-1}]
    else:
        full = ang.repeat_interleave(2, dim=-1)         # [a0, a0, a1, a1, ...]
    return (full.cos().to(dtype).view(1, S, 1, D), full.sin().to(dtype).view(1, S, 1, D),
            ang)


def _ref_rotary_complex(x: torch.Tensor, ang: torch.Tensor, mode: str) -> torch.Tensor:
    """Rotation as complex multiplication by exp(i*angle), x [B, S, N, D]."""
    xf = x.double()
    D = x.shape[-1]
    if mode == "half":
        z = torch.complex(xf[..., : D // 2], xf[..., D // 2:])
    else:
        z = torch.complex(xf[..., 0::2], xf[..., 1::2])
    rot = z * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    if mode == "half":
        return torch.cat((rot.real, rot.imag), dim=-1)
    return torch.stack((rot.real, rot.imag), dim=-1).flatten(-2)


def _ref_rotary_explicit(x, r1, r2, mode):
    """out = x*cos + rot(x)*sin with rot written out element by element."""
    xf, c, s = x.float(), r1.float(), r2.float()
    D = x.shape[-1]
    rot = torch.empty_like(xf)
    if mode == "half":
        h = D // 2
        for d in range(h):
            rot[..., d] = -xf[..., d + h]
            rot[..., d + h] = xf[..., d]
    else:
        for d in range(0, D, 2):
            rot[..., d] = -xf[..., d + 1]
            rot[..., d + 1] = xf[..., d]
    return xf * c + rot * s


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("B,S,N,D", [(2, 5, 3, 16), (1, 1, 1, 2), (3, 7, 5, 6)])
def test_rotary_mul_matches_reference(dtype, mode, B, S, N, D):
    x = torch.randn(B, S, N, D, generator=_gen(9)).to(dtype)
    cos, sin, ang = _cos_sin(S, D, mode, dtype)
    out = npu_rotary_mul(x, cos, sin, rotary_mode=mode)
    assert out.shape == x.shape and out.dtype == dtype
    _close(out, _ref_rotary_explicit(x, cos, sin, mode), dtype)
    if dtype == torch.float32:
        # Cross-check with complex rotation (cos/sin rounded to fp32: looser atol).
        torch.testing.assert_close(out.double(), _ref_rotary_complex(x, ang, mode),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_preserves_pair_norms(mode):
    B, S, N, D = 2, 6, 4, 8
    x = torch.randn(B, S, N, D, generator=_gen(10), dtype=torch.float64).float()
    cos, sin, _ = _cos_sin(S, D, mode, torch.float32)
    out = npu_rotary_mul(x, cos, sin, rotary_mode=mode)
    if mode == "half":
        def pair_norm(t):
            return t[..., : D // 2] ** 2 + t[..., D // 2:] ** 2
    else:
        def pair_norm(t):
            return t[..., 0::2] ** 2 + t[..., 1::2] ** 2
    torch.testing.assert_close(pair_norm(out), pair_norm(x), atol=1e-5, rtol=1e-5)
    # Position 0 has angle 0: identity.
    torch.testing.assert_close(out[:, 0], x[:, 0], atol=1e-6, rtol=0)


def test_rotary_modes_differ():
    # Same cos/sin (all angles distinct per pair) applied in the two modes must differ,
    # so a mix-up between them would be caught.
    x = torch.randn(1, 3, 2, 8, generator=_gen(11))
    r1 = torch.randn(1, 3, 1, 8, generator=_gen(12))
    r2 = torch.randn(1, 3, 1, 8, generator=_gen(13))
    a = npu_rotary_mul(x, r1, r2, rotary_mode="half")
    b = npu_rotary_mul(x, r1, r2, rotary_mode="interleave")
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a, _ref_rotary_explicit(x, r1, r2, "half"))
    torch.testing.assert_close(b, _ref_rotary_explicit(x, r1, r2, "interleave"))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("native_kernel", [True, False])
def test_rotary_mul_takes_strided_x(monkeypatch, dtype, mode, native_kernel):
    """x may be a view (aclnnRotaryPositionEmbedding: x "supports non-contiguous tensors",
    ops-transformer aclnn_rotary_position_embedding.h): query heads sliced out of a fused
    qkv row, and the first rotary_dim features of each head."""
    from vllm_npu.ops.sim import native
    taken, kernel = [], native.rotary_mul

    def spy(*args, **kwargs):
        out = kernel(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(native, "rotary_mul", spy if native_kernel else lambda *a, **k: None)
    S, N, Nk, D = 7, 3, 2, 16
    qkv = torch.randn(1, S, (N + 2 * Nk) * D, generator=_gen(20)).to(dtype)
    q = qkv[..., :N * D].view(1, S, N, D)
    partial = q[..., :8]
    assert not q.is_contiguous() and not partial.is_contiguous()
    for x, width in ((q, D), (partial, 8)):
        cos, sin, _ = _cos_sin(S, width, mode, dtype)
        out = npu_rotary_mul(x, cos, sin, rotary_mode=mode)
        assert out.shape == x.shape and out.is_contiguous()
        _close(out, _ref_rotary_explicit(x.contiguous(), cos, sin, mode), dtype)
    assert torch.equal(qkv[..., :N * D].view(1, S, N, D), q)  # input untouched
    if native_kernel and dtype == torch.float32 and native.library() is not None:
        assert taken == [True, True]  # the kernel read the strided rows itself


@pytest.mark.parametrize("rshape", [(1, 4, 1, 8), (2, 4, 3, 8), (1, 1, 1, 8), (2, 1, 3, 8)])
def test_rotary_mul_broadcasts_r(rshape):
    x = torch.randn(2, 4, 3, 8, generator=_gen(14))
    r1 = torch.randn(rshape, generator=_gen(15))
    r2 = torch.randn(rshape, generator=_gen(16))
    out = npu_rotary_mul(x, r1, r2)
    ref = _ref_rotary_explicit(x, r1.expand_as(x), r2.expand_as(x), "half")
    torch.testing.assert_close(out, ref)


def test_rotary_mul_default_mode_is_half():
    x = torch.randn(1, 2, 1, 4, generator=_gen(17))
    r1 = torch.randn(1, 2, 1, 4, generator=_gen(18))
    r2 = torch.randn(1, 2, 1, 4, generator=_gen(19))
    torch.testing.assert_close(npu_rotary_mul(x, r1, r2),
                               _ref_rotary_explicit(x, r1, r2, "half"))


def test_rotary_mul_refuses_int32():
    x = torch.ones(1, 2, 1, 4, dtype=torch.int32)
    with pytest.raises(NPUOpError, match=r"npu_rotary_mul: x has dtype torch\.int32"):
        npu_rotary_mul(x, x, x)


def test_rotary_mul_refuses_mixed_dtypes():
    x = torch.ones(1, 2, 1, 4)
    r = torch.ones(1, 2, 1, 4, dtype=torch.float16)
    with pytest.raises(NPUOpError, match=r"npu_rotary_mul: inputs must share one dtype"):
        npu_rotary_mul(x, r, r)


def test_rotary_mul_refuses_odd_last_dim():
    x = torch.ones(1, 2, 1, 5)
    with pytest.raises(NPUOpError, match=r"last dim of x must be even, got 5"):
        npu_rotary_mul(x, x, x)


@pytest.mark.parametrize("mode", ["neox", "", "HALF", None])
def test_rotary_mul_refuses_bad_mode(mode):
    x = torch.ones(1, 2, 1, 4)
    with pytest.raises(NPUOpError, match=r"rotary_mode=.*supported: 'half', 'interleave'"):
        npu_rotary_mul(x, x, x, rotary_mode=mode)


def test_rotary_mul_refuses_non_4d():
    x = torch.ones(2, 1, 4)
    with pytest.raises(NPUOpError, match=r"npu_rotary_mul: x must be 4-D"):
        npu_rotary_mul(x, x, x)


@pytest.mark.parametrize("which", ["r1", "r2"])
def test_rotary_mul_refuses_non_broadcastable(which):
    x = torch.ones(2, 4, 3, 8)
    good = torch.ones(1, 4, 1, 8)
    bad = torch.ones(1, 3, 1, 8)  # S=3 against S=4
    r1, r2 = (bad, good) if which == "r1" else (good, bad)
    with pytest.raises(NPUOpError, match=rf"{which} \(1, 3, 1, 8\) does not broadcast to x"):
        npu_rotary_mul(x, r1, r2)


def test_rotary_mul_refuses_partial_last_dim():
    x = torch.ones(1, 2, 1, 8)
    r = torch.ones(1, 2, 1, 4)
    with pytest.raises(NPUOpError, match=r"r1 last dim 4 != x last dim 8"):
        npu_rotary_mul(x, r, r)
