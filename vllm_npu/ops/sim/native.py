"""The simulated NPU's native kernels library (`csrc/sim_kernels.c`, `csrc/sim_rows.c`),
loaded with ctypes, and its row kernels: RMSNorm with the residual add, rotary multiply,
SwiGLU and the KV cache scatter; a replay's linears split by rows over torch's OpenMP
team; and prepared launches (`Launch`), which a graph replay runs in one call
(`run_launches`, `csrc/sim_program.c`).

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
import struct
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vllm_npu.ops.sim import cores

LIBRARY = Path(__file__).with_name("libnpu_sim_kernels.so")
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_I64x16 = _i64 * 16


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library with its entry points' signatures, or None without one (the row
    kernels are called through their tasks, `Launch`)."""
    if not LIBRARY.exists():
        return None
    lib = ctypes.CDLL(str(LIBRARY))
    lib.npu_sim_run.argtypes = [_ptr, _ptr, _i64, ctypes.POINTER(_i64)]
    lib.npu_sim_run.restype = _i64
    return lib


# ---- prepared launches -------------------------------------------------------------------

_TASK = ctypes.CFUNCTYPE(_i64, _ptr)


@functools.cache
def _task(name: str) -> tuple[Callable[[Any], int], int]:
    """The library's task function `npu_sim_task_<name>`: callable, and its address."""
    address = ctypes.cast(getattr(library(), f"npu_sim_task_{name}"), _ptr).value
    return _TASK(address), address


def _slots(*values: int | float | None) -> ctypes.Array:
    return (_i64 * len(values))(*map(_slot, values))


def _slot(value: int | float | None) -> int:
    if isinstance(value, float):
        return struct.unpack("q", struct.pack("d", value))[0]
    return 0 if value is None else int(value)


class Launch:
    """One kernel's launch with every argument fixed when the op is issued: its task
    function (`csrc/sim_program.c`) and argument slots (addresses, sizes, doubles' bits).

    `keep` holds what the slots point at and no tensor owns (host copies, argument
    structs); `tensors`, the device tensors whose memory the launch addresses where the
    caller holds them (a replay checks their storages have not moved, graph.py); `error`
    raises the op's error for a nonzero status. Calling it launches it alone."""
    __slots__ = ("task", "address", "args", "keep", "tensors", "bases", "error")

    def __init__(self, task: str, values: Sequence[int | float | None], *, keep: tuple = (),
                 tensors: tuple = (), error: Callable[[int], None] | None = None) -> None:
        self.task = task
        self.address = _task(task)[1]
        self.args = _slots(*values)
        self.keep, self.tensors, self.error = keep, tensors, error
        # where the tensors' storages were when the launch took their addresses
        self.bases = tuple(t.untyped_storage().data_ptr() for t in tensors)

    def fail(self, status: int) -> None:
        if self.error is not None:
            self.error(status)
        raise RuntimeError(f"simulated NPU kernel {self.task} failed with status {status}")

    def __call__(self) -> None:
        status = _task(self.task)[0](self.args)
        if status:
            self.fail(status)


class LaunchList:
    """Launches run in order by one native call (`npu_sim_run`); built once, slots
    replaceable (a task update's new launches)."""

    def __init__(self, launches: list[Launch]) -> None:
        self.launches = launches
        n = len(launches)
        self.fns = (_ptr * n)(*(x.address for x in launches))
        self.argv = (_ptr * n)(*(ctypes.addressof(x.args) for x in launches))
        self.status = _i64()

    def replace(self, i: int, launch: Launch) -> None:
        self.launches[i] = launch
        self.fns[i] = launch.address
        self.argv[i] = ctypes.addressof(launch.args)

    def __call__(self) -> None:
        n = len(self.launches)
        done = library().npu_sim_run(self.fns, self.argv, n, ctypes.byref(self.status))
        if done < n:
            self.launches[done].fail(self.status.value)


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
    prepared = rms_norm_launch(x1, x2, gamma, eps, out)
    if prepared is None:
        return None
    prepared[0]()
    return prepared[1]


def rms_norm_launch(x1: torch.Tensor, x2: torch.Tensor | None, gamma: torch.Tensor,
                    eps: float, out: tuple | None = None):
    """`rms_norm` prepared: (its Launch, its outputs), or None where not covered."""
    inputs = (x1, gamma) if x2 is None else (x1, x2, gamma)
    if library() is None or not _f32_contiguous(*inputs) or x1.numel() == 0:
        return None
    cols = gamma.numel()
    given = tuple(out or ()) + (None,) * 3
    y = _dest(given[0], x1.shape)
    rstd = _dest(given[1], (*x1.shape[:x1.dim() - gamma.dim()], *([1] * gamma.dim())))
    xsum = _dest(given[2], x1.shape) if x2 is not None else None
    if y is None or rstd is None or (x2 is not None and xsum is None):
        return None
    tensors = tuple(t for t in (x1, x2, gamma, y, rstd, xsum) if t is not None)
    launch = Launch("rms_norm", [_address(x1), _address(x2), gamma.data_ptr(), y.data_ptr(),
                                 rstd.data_ptr(), _address(xsum), x1.numel() // cols, cols,
                                 float(eps), cores.device_cores()], tensors=tensors)
    return launch, (y, rstd, xsum)


def _launched(prepared: tuple | None) -> torch.Tensor | None:
    """A (launch or None, output) pair from a `*_launch` builder run now: the output, or
    None where the builder did not cover the call."""
    if prepared is None:
        return None
    launch, out = prepared
    if launch is not None:
        launch()
    return out


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
               interleave: bool, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """x * r1 + rotate(x) * r2 for 4-D float32 x (r1/r2 broadcast to it, every last dim
    contiguous), into `out` where given; None otherwise."""
    return _launched(rotary_mul_launch(x, r1, r2, interleave, out))


def rotary_mul_launch(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                      interleave: bool, out: torch.Tensor | None = None):
    """`rotary_mul` prepared: (its Launch, or None for an empty x; its output), or None
    where not covered."""
    if library() is None or any(t.dtype != torch.float32 or t.stride(3) != 1
                                for t in (x, r1, r2)):
        return None
    out = _dest(out, x.shape)
    if out is None:
        return None
    if out.numel() == 0:
        return None, out
    # shape, then x's, r1's and r2's strides (0 along a broadcast dim): one array
    dims = _I64x16(*x.shape, *x.stride(), *_broadcast_strides(r1), *_broadcast_strides(r2))
    launch = Launch("rotary_mul", [x.data_ptr(), r1.data_ptr(), r2.data_ptr(), out.data_ptr(),
                                   ctypes.addressof(dims), int(interleave),
                                   cores.device_cores()],
                    keep=(dims,), tensors=(x, r1, r2, out))
    return launch, out


def _broadcast_strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(0 if n == 1 else st for n, st in zip(t.shape, t.stride()))


def swiglu(x: torch.Tensor, dim: int, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """silu(first half) * second half along the last dim of a float32 contiguous x, into
    `out` where given; None otherwise."""
    return _launched(swiglu_launch(x, dim, out))


def swiglu_launch(x: torch.Tensor, dim: int, out: torch.Tensor | None = None):
    """`swiglu` prepared: (its Launch, or None for an empty output; the output), or None
    where not covered."""
    if library() is None or x.dtype != torch.float32 or not x.is_contiguous() \
            or x.dim() == 0 or dim not in (-1, x.dim() - 1):
        return None
    out = _dest(out, (*x.shape[:-1], x.shape[-1] // 2))
    if out is None:
        return None
    if not out.numel():
        return None, out
    return Launch("swiglu", [x.data_ptr(), out.data_ptr(), out.numel() // out.shape[-1],
                             out.shape[-1], cores.device_cores()], tensors=(x, out)), out


def scatter_rows(src: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor) -> int | None:
    """cache.view(capacity, -1)[slots[t]] = src[t] for slots >= 0, negative slots skipped.

    src [T, ...] whose rows are contiguous (a row stride of its own), cache contiguous of
    src's dtype, slots int32 [T] contiguous. Returns -1 when written, the index of the
    first slot >= capacity when refused (nothing written), None when not covered."""
    launch = scatter_launch(src, slots, cache)
    if launch is None:
        return None
    return _task("scatter")[0](launch.args) - 1


def scatter_launch(src: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor,
                   error: Callable[[int], None] | None = None) -> Launch | None:
    """`scatter_rows` prepared (the tensors by address; a nonzero status is 1 + the index
    of the first slot past the cache, passed to `error`), or None when not covered."""
    row = src[0].numel() if src.shape[0] else 0
    if library() is None or src.dim() < 2 or not slots.is_contiguous() or not src.shape[0] \
            or not src[0].is_contiguous() or src.dtype != cache.dtype:
        return None
    return Launch("scatter", [src.data_ptr(), src.stride(0) * src.element_size(),
                              slots.data_ptr(), src.shape[0], cache.data_ptr(),
                              row * src.element_size(), cache.numel() // row], error=error)


def _linear_slots(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  out: torch.Tensor, threads: int) -> list | None:
    """The linear task's slots (csrc/sim_program.c `npu_sim_task_linear`), or None where it
    does not cover the call: no library; not 2-D float32 with x, out (and bias) contiguous
    and the weight contiguous or K-major (`weight.t()` contiguous, the device's layout,
    layers/linear.py) with its N in whole vectors of 16."""
    tensors = (x, out) if bias is None else (x, bias, out)
    if library() is None or not _f32_contiguous(*tensors) or x.dim() != 2 or weight.dim() != 2 \
            or weight.dtype != torch.float32 or out.shape != (x.shape[0], weight.shape[0]) \
            or x.shape[1] != weight.shape[1] or not x.numel() or not out.numel() \
            or (bias is not None and bias.shape != (weight.shape[0],)):
        return None
    kmajor = not weight.is_contiguous()
    if kmajor and (not weight.t().is_contiguous() or weight.shape[0] % 16):
        return None
    return [x.data_ptr(), weight.data_ptr(), _address(bias), out.data_ptr(), x.shape[0],
            weight.shape[0], x.shape[1], threads, int(kmajor)]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor, threads: int) -> bool:
    """out = x . weight^T (+ bias) on `threads` of torch's OpenMP team: `npu_sim_gemm`
    (csrc/sim_gemm.c) for a K-major weight or an inner dim in whole vectors of 16, else
    MKL's sgemm on rows split between them (`npu_sim_linear`); False where it does not
    cover the case (`_linear_slots`; no GNU OpenMP or MKL), written nothing then."""
    slots = _linear_slots(x, weight, bias, out, threads)
    return slots is not None and _task("linear")[0](_slots(*slots)) == 0


_INT32_MAX = 2**31 - 1  # MKL's sgemm takes 32-bit sizes (csrc/sim_kernels.c npu_sim_linear)


@functools.cache
def _linear_task_runs(inner: int) -> bool:
    """Whether the linear task runs in this process for an inner dim like `inner`: its
    only failure past `_linear_slots`' checks is GNU OpenMP (or, inner dims not in whole
    vectors of 16, MKL's sgemm) not found, which the library looks up once per process."""
    x, weight = torch.ones(2, inner), torch.ones(16, inner)
    out = torch.empty(2, 16)
    slots = _linear_slots(x, weight, None, out, 2)
    return slots is not None and _task("linear")[0](_slots(*slots)) == 0


def linear_launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  out: torch.Tensor, threads: int) -> Launch | None:
    """`linear` prepared, or None where it does not cover the case (`_linear_slots`, and
    the task probed once per process: graph capture prepares one per captured linear)."""
    slots = _linear_slots(x, weight, bias, out, threads)
    if slots is None:
        return None
    by_sgemm = not slots[-1] and x.shape[1] % 16 != 0  # csrc/sim_program.c's dispatch
    if not _linear_task_runs(3 if by_sgemm else 16) \
            or by_sgemm and max(x.shape[0], weight.shape[0], x.shape[1]) > _INT32_MAX:
        return None
    tensors = (x, weight, out) if bias is None else (x, weight, bias, out)
    return Launch("linear", slots, tensors=tensors)


# the copy task's conversions (csrc/sim_program.c COPY_*): same dtype, or integer ids and
# positions widened / narrowed
_COPY_KINDS = {(torch.int32, torch.int64): 1, (torch.int64, torch.int32): 2}


def copy_launch(out: torch.Tensor, src: torch.Tensor) -> Launch | None:
    """out = src (any strides, up to 4 dims, src's shape; the same dtype, or int32 <->
    int64), or None where not covered."""
    kind = 0 if out.dtype == src.dtype else _COPY_KINDS.get((src.dtype, out.dtype))
    if library() is None or kind is None or out.shape != src.shape \
            or not 1 <= src.dim() <= 4 or not src.numel():
        return None
    pad = 4 - src.dim()
    return Launch("copy", [out.data_ptr(), src.data_ptr(), src.element_size(), kind,
                           *((1,) * pad + tuple(src.shape)),
                           *((0,) * pad + tuple(src.stride())),
                           *((0,) * pad + tuple(out.stride()))], tensors=(out, src))


def gather_launch(out: torch.Tensor, table: torch.Tensor, index: torch.Tensor,
                  error: Callable[[int], None]) -> Launch | None:
    """out[i] = table[index[i]] along table's first dim, all contiguous (`embedding`,
    `index_select(.., 0, ..)`); a nonzero status (1 + the position of an index outside
    the table, nothing written) goes to `error`. None where not covered."""
    if library() is None or table.dim() < 1 or not table.is_contiguous() \
            or not index.is_contiguous() or index.dtype not in (torch.int32, torch.int64) \
            or not out.is_contiguous() or out.dtype != table.dtype \
            or out.numel() != index.numel() * (table[0].numel() if table.shape[0] else 0) \
            or not index.numel():
        return None
    row = table[0].numel() * table.element_size()
    return Launch("gather_rows", [out.data_ptr(), table.data_ptr(), index.data_ptr(),
                                  index.numel(), row, table.shape[0], index.element_size()],
                  tensors=(out, table, index), error=error)
