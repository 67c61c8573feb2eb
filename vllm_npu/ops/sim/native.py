"""The simulated NPU's native kernels library (`csrc/sim_kernels.c`, `csrc/sim_rows.c`),
loaded with ctypes, and its row kernels: RMSNorm with the residual add, rotary multiply,
SwiGLU and the KV cache scatter; and a replay's linears split by rows over torch's OpenMP
team.

Each wrapper takes what the PyTorch op in norm.py / rotary.py / activation.py / cache.py
has already checked (the device's rules are enforced there, before any call here) and
returns None where the kernel does not cover the case (no library: an install without a
C compiler; not float32; a layout the kernel does not take), so that the caller keeps its
PyTorch path. The results equal those paths (rotary, scatter: bitwise; RMSNorm, SwiGLU:
within a few ulp, another summation order and exp polynomial).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

LIBRARY = Path(__file__).with_name("libnpu_sim_kernels.so")
_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_I64x16 = _i64 * 16


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library with its row kernels' signatures, or None without one."""
    if not LIBRARY.exists():
        return None
    lib = ctypes.CDLL(str(LIBRARY))
    lib.npu_sim_rms_norm.argtypes = [_ptr] * 6 + [_i64, _i64, _f32]
    lib.npu_sim_rms_norm.restype = None
    lib.npu_sim_rotary_mul.argtypes = [_ptr] * 5 + [ctypes.c_int32]
    lib.npu_sim_rotary_mul.restype = None
    lib.npu_sim_swiglu.argtypes = [_ptr, _ptr, _i64, _i64]
    lib.npu_sim_swiglu.restype = None
    lib.npu_sim_scatter_rows.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _i64, _i64]
    lib.npu_sim_scatter_rows.restype = _i64
    lib.npu_sim_linear.argtypes = [_ptr] * 4 + [_i64, _i64, _i64, ctypes.c_int]
    lib.npu_sim_linear.restype = ctypes.c_int
    return lib


def _f32_contiguous(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def _dest(out: torch.Tensor | None, shape: torch.Size | tuple) -> torch.Tensor | None:
    """`out` where given (a graph replay's captured output: float32, contiguous, `shape`),
    else a new tensor; None when a given `out` does not fit (the caller's fallback)."""
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    return out if out.shape == shape and _f32_contiguous(out) else None


def rms_norm(x1: torch.Tensor, x2: torch.Tensor | None, gamma: torch.Tensor, eps: float,
             out: tuple | None = None):
    """(y, rstd, x1 + x2 or None) for float32 contiguous inputs; None otherwise. `out`:
    (y, rstd[, xsum]) to write instead of new tensors."""
    lib = library()
    inputs = (x1, gamma) if x2 is None else (x1, x2, gamma)
    if lib is None or not _f32_contiguous(*inputs) or x1.numel() == 0:
        return None
    cols = gamma.numel()
    rows = x1.numel() // cols
    given = tuple(out or ()) + (None,) * 3
    y = _dest(given[0], x1.shape)
    rstd = _dest(given[1], (*x1.shape[:x1.dim() - gamma.dim()], *([1] * gamma.dim())))
    xsum = _dest(given[2], x1.shape) if x2 is not None else None
    if y is None or rstd is None or (x2 is not None and xsum is None):
        return None
    lib.npu_sim_rms_norm(x1.data_ptr(), None if x2 is None else x2.data_ptr(),
                         gamma.data_ptr(), y.data_ptr(), rstd.data_ptr(),
                         None if xsum is None else xsum.data_ptr(), rows, cols, eps)
    return y, rstd, xsum


def rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
               interleave: bool, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """x * r1 + rotate(x) * r2 for 4-D float32 x (r1/r2 broadcast to it, every last dim
    contiguous), into `out` where given; None otherwise."""
    lib = library()
    if lib is None or any(t.dtype != torch.float32 or t.stride(3) != 1 for t in (x, r1, r2)):
        return None
    out = _dest(out, x.shape)
    if out is None or out.numel() == 0:
        return out
    # shape, then x's, r1's and r2's strides (0 along a broadcast dim): one array
    dims = _I64x16(*x.shape, *x.stride(), *_broadcast_strides(r1), *_broadcast_strides(r2))
    lib.npu_sim_rotary_mul(x.data_ptr(), r1.data_ptr(), r2.data_ptr(), out.data_ptr(),
                           dims, int(interleave))
    return out


def _broadcast_strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(0 if n == 1 else st for n, st in zip(t.shape, t.stride()))


def swiglu(x: torch.Tensor, dim: int, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """silu(first half) * second half along the last dim of a float32 contiguous x, into
    `out` where given; None otherwise."""
    lib = library()
    if lib is None or x.dtype != torch.float32 or not x.is_contiguous() or x.dim() == 0 \
            or dim not in (-1, x.dim() - 1):
        return None
    out = _dest(out, (*x.shape[:-1], x.shape[-1] // 2))
    if out is not None and out.numel():
        lib.npu_sim_swiglu(x.data_ptr(), out.data_ptr(), out.numel() // out.shape[-1],
                           out.shape[-1])
    return out


def scatter_rows(src: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor) -> int | None:
    """cache.view(capacity, -1)[slots[t]] = src[t] for slots >= 0, negative slots skipped.

    src [T, ...] whose rows are contiguous (a row stride of its own), cache contiguous of
    src's dtype, slots int32 [T] contiguous. Returns -1 when written, the index of the
    first slot >= capacity when refused (nothing written), None when not covered."""
    launch = scatter_launch(src, slots, cache)
    return None if launch is None else launch()


def scatter_launch(src: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor):
    """`scatter_rows` with its arguments fixed (the tensors by address): a callable
    returning what scatter_rows returns, or None when not covered."""
    lib = library()
    row = src[0].numel() if src.shape[0] else 0
    if lib is None or src.dim() < 2 or not slots.is_contiguous() or not src.shape[0] \
            or not src[0].is_contiguous() or src.dtype != cache.dtype:
        return None
    return functools.partial(lib.npu_sim_scatter_rows, src.data_ptr(),
                             src.stride(0) * src.element_size(), slots.data_ptr(),
                             src.shape[0], cache.data_ptr(), row * src.element_size(),
                             cache.numel() // row)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor, threads: int) -> bool:
    """out = x . weight^T (+ bias) on `threads` of torch's OpenMP team, rows split between
    them (`npu_sim_linear`); False where it does not cover the case (no library, GNU
    OpenMP or MKL; not 2-D float32 contiguous), written nothing then."""
    lib = library()
    tensors = (x, weight, out) if bias is None else (x, weight, bias, out)
    if lib is None or not _f32_contiguous(*tensors) or x.dim() != 2 or weight.dim() != 2 \
            or out.shape != (x.shape[0], weight.shape[0]) or x.shape[1] != weight.shape[1] \
            or (bias is not None and bias.shape != (weight.shape[0],)) or not x.numel() \
            or not out.numel():
        return False
    return lib.npu_sim_linear(x.data_ptr(), weight.data_ptr(),
                              None if bias is None else bias.data_ptr(), out.data_ptr(),
                              x.shape[0], weight.shape[0], x.shape[1], threads) == 0
