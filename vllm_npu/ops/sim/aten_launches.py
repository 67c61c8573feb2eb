"""Kernel launches prepared at capture for the aten ops a graph replay would otherwise
re-run (graph.py `_Entry`): copies and dtype conversions of integer ids, gathers
(embedding, index_select on dim 0), concatenation into the captured output, and `linear`
on the device's cores. Each returns None where its kernel does not cover the call (the
replay then runs the op, or its `out=` overload, and copies into the captured output).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from vllm_npu.ops.sim import linear, native


def _copy_launch(x: torch.Tensor, *args: Any, out: torch.Tensor,
                 **kwargs: Any) -> native.Launch | None:
    """graph.py's `_copy_replay` prepared at capture (native.copy_launch: no dtype
    change, or integer ids widened / narrowed)."""
    return native.copy_launch(out, x)


def _raise_as(func, args: tuple, kwargs: dict) -> Callable[[int], None]:
    """A launch's refusal (an index outside its table) raised as the aten op raises it."""
    def error(status: int) -> None:
        func(*args, **kwargs)
    return error


def _embedding_launch(weight: torch.Tensor, indices: torch.Tensor, *args: Any,
                      out: torch.Tensor) -> native.Launch | None:
    error = _raise_as(torch.ops.aten.embedding.default, (weight, indices, *args), {})
    return native.gather_launch(out, weight, indices, error)


def _index_select_launch(x: torch.Tensor, dim: int, index: torch.Tensor, *,
                         out: torch.Tensor) -> native.Launch | None:
    error = _raise_as(torch.ops.aten.index_select.default, (x, dim, index), {})
    return native.gather_launch(out, x, index, error) if dim == 0 else None


def _cat_launch(tensors: list, dim: int = 0, *, out: torch.Tensor) -> tuple | None:
    """One copy per input into its slice of the captured output."""
    dim, start, launches = dim % out.dim(), 0, []
    for t in tensors:
        launches.append(native.copy_launch(out.narrow(dim, start, t.shape[dim]), t))
        start += t.shape[dim]
    return None if not launches or None in launches else tuple(launches)


# the aten ops whose kernels are prepared at capture (None where not covered: the replay
# calls the function or the out overload)
OWN_LAUNCH = {torch.ops.aten.linear.default: linear.replay_linear_launch,
              torch.ops.aten.contiguous.default: _copy_launch,
              torch.ops.aten.to.dtype: _copy_launch,
              torch.ops.aten.embedding.default: _embedding_launch,
              torch.ops.aten.index_select.default: _index_select_launch,
              torch.ops.aten.cat.default: _cat_launch}
