"""The simulated NPU's native row kernels (csrc/sim_rows.c via vllm_npu/ops/sim/native.py)
against the PyTorch paths they replace (the same ops with the library hidden): rotary and
the KV cache scatter bitwise, RMSNorm and SwiGLU within 1e-6 relative (and SwiGLU against
HF's formula, F.silu(gate) * up)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import _npu_reshape_and_cache, native, npu_add_rms_norm, npu_rms_norm, \
    npu_rotary_mul, npu_swiglu
from vllm_npu.ops.sim.checks import NPUOpError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def torch_path(monkeypatch):
    """Run a call with the native library hidden: the ops' PyTorch paths."""
    def run(fn, *args):
        with monkeypatch.context() as m:
            m.setattr(native, "library", lambda: None)
            return fn(*args)
    return run


def test_the_install_built_the_library():
    assert native.library() is not None, f"{native.LIBRARY} missing: `make install` builds it"


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("layout", ["contiguous", "qkv-view", "full-r"])
def test_rotary_is_bitwise_the_pytorch_path(torch_path, mode, layout):
    g = _gen(3)
    T, N, D = 37, 4, 32
    if layout == "qkv-view":  # q as vLLM splits it out of the fused qkv projection
        x = torch.randn(T, (N + 4) * D, generator=g)[:, :N * D].view(T, 1, N, D)
    else:
        x = torch.randn(T, 1, N, D, generator=g)
    rshape = (T, 1, N, D) if layout == "full-r" else (T, 1, 1, D)
    cos, sin = torch.randn(rshape, generator=g), torch.randn(rshape, generator=g)
    got = npu_rotary_mul(x, cos, sin, mode)
    assert torch.equal(got, torch_path(npu_rotary_mul, x, cos, sin, mode))


@pytest.mark.parametrize("shape,gamma_dims", [((128, 128), 1), ((8192, 128), 1),
                                               ((3, 5, 64), 2), ((1, 7), 1)])
def test_rms_norms_match_the_pytorch_path(torch_path, shape, gamma_dims):
    g = _gen(5)
    x, r = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    gamma = torch.rand(shape[-gamma_dims:], generator=g) + 0.5
    for got, ref in ((npu_rms_norm(x, gamma, 1e-6), torch_path(npu_rms_norm, x, gamma, 1e-6)),
                     (npu_add_rms_norm(x, r, gamma, 1e-5),
                      torch_path(npu_add_rms_norm, x, r, gamma, 1e-5))):
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(npu_add_rms_norm(x, r, gamma)[2], x + r)


@pytest.mark.parametrize("shape", [(5, 256), (8192, 512), (2, 3, 64)])
def test_swiglu_matches_the_pytorch_path_and_hf(torch_path, shape):
    x = torch.randn(shape, generator=_gen(13)) * 6  # both signs, large magnitudes
    got = npu_swiglu(x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(got, torch_path(npu_swiglu, x), rtol=1e-6, atol=1e-7)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-6, atol=1e-7)
    assert native.swiglu(x, -1) is not None  # the native path ran


def test_large_row_ops_split_over_the_device_cores_give_the_same_result(torch_path,
                                                                      monkeypatch):
    """An eager prefill's row ops (>= 64K floats) run in runs of rows on torch's OpenMP
    team, one run per device core: any core count (uneven splits included) gives bitwise
    one core's result, which is the PyTorch path's (rotary bitwise, the others within
    1e-6)."""
    from vllm_npu.ops.sim import cores

    g = _gen(21)
    T = 1001  # not a multiple of 2 or 3
    x = torch.randn(T, 512, generator=g) * 6
    h, r = torch.randn(T, 128, generator=g), torch.randn(T, 128, generator=g)
    gamma = torch.rand(128, generator=g) + 0.5
    q = torch.randn(T, 4 * 32 + 64, generator=g)[:, :4 * 32].view(T, 1, 4, 32)
    cos, sin = torch.randn(T, 1, 1, 32, generator=g), torch.randn(T, 1, 1, 32, generator=g)

    def run():
        return (npu_swiglu(x), *npu_add_rms_norm(h, r, gamma, 1e-6),
                npu_rotary_mul(q, cos, sin, "half"))
    results = []
    for n in (1, 2, 3):
        monkeypatch.setattr(cores, "device_cores", lambda n=n: n)
        results.append(run())
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    ref = torch_path(run)
    for a, b in zip(results[0][:-1], ref[:-1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(results[0][-1], ref[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_scatter_is_the_pytorch_path(torch_path, dtype):
    """Keys as strided views of the qkv projection, padding slots (-1) skipped."""
    g = _gen(7)
    T, H, D, blocks, bs = 20, 2, 32, 6, 128
    qkv = torch.randn(T, 4 * H * D, generator=g).to(dtype)
    key = qkv[:, 2 * H * D:3 * H * D].view(T, H, D)
    value = qkv[:, 3 * H * D:].view(T, H, D)
    slots = torch.randperm(blocks * bs, generator=g)[:T].to(torch.int32)
    slots[[3, 11]] = -1
    caches = [torch.randn(blocks, bs, H, D, generator=g).to(dtype) for _ in range(2)]
    ref = [c.clone() for c in caches]
    _npu_reshape_and_cache(key, value, *caches, slots)
    torch_path(_npu_reshape_and_cache, key, value, *ref, slots)
    assert all(torch.equal(a, b) for a, b in zip(caches, ref))
    assert native.scatter_rows(key, slots, caches[0]) == -1  # the native path ran


def test_cache_scatter_refusal_writes_nothing():
    g = _gen(9)
    key = torch.randn(4, 2, 32, generator=g)
    caches = [torch.zeros(2, 128, 2, 32) for _ in range(2)]
    slots = torch.tensor([0, 5, 256, 1], dtype=torch.int32)  # 256 = capacity
    assert native.scatter_rows(key, slots, caches[0]) == 2
    with pytest.raises(NPUOpError, match="slot indices must be < 256"):
        _npu_reshape_and_cache(key, key, *caches, slots)
    assert not any(c.any() for c in caches)
