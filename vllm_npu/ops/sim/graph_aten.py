"""How a simulated graph capture treats one aten call (graph.py's recorder): which calls are
static (allocations, views: no replay work), which replay into their captured output in
place (an `out=` overload, or the simulator's own replay function), and which run on the
simulated device's cores (matrix products)."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from vllm_npu.ops.sim import linear


def copy_one(old: torch.Tensor, new: torch.Tensor) -> None:
    if old is not new and (old.data_ptr() != new.data_ptr() or old.stride() != new.stride()):
        old.copy_(new)


def copy_into(captured: Any, fresh: Any) -> None:
    for old, new in zip(tree_leaves(captured), tree_leaves(fresh)):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            copy_one(old, new)


# Matrix products: replayed on the simulated device's cores (cores.device_compute_threads;
# `linear` splits its rows over them itself, ops/sim/linear.py), the rest of a replay on
# vLLM's one torch thread (elementwise ops of a decode batch are below torch's parallel
# grain). A device's matmul likewise runs on all its cube cores.
MATMULS = frozenset(f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "matmul"))


def copy_replay(x: torch.Tensor, *args: Any, out: torch.Tensor, **kwargs: Any) -> None:
    """A replayed `contiguous` / `to(dtype)`: its captured output is its input copied (and
    converted: `copy_` converts as `to` does), written in place instead of a fresh tensor
    copied in."""
    copy_one(out, x)


# aten ops the simulator replays with a function of its own (same arguments, `out=`):
# `linear` uses the device's cores itself (the aten ops whose kernels are prepared at
# capture: aten_launches.py)
OWN_REPLAY = {torch.ops.aten.linear.default: linear.replay_linear_into,
               torch.ops.aten.contiguous.default: copy_replay,
               torch.ops.aten.to.dtype: copy_replay}

# Allocations recorded during capture: on a device they are graph-pool memory, not tasks;
# the captured buffer is what the graph reads and writes at every replay.
ALLOCATIONS = frozenset(f"aten::{name}" for name in (
    "empty.memory_format", "empty_like", "new_empty", "empty_strided", "new_empty_strided"))


def is_static(func, args: tuple, kwargs: dict, out: Any) -> bool:
    """An aten call a replay need not re-run: an allocation, or a view whose every output
    aliases one of its inputs (shapes and strides are fixed in a graph, so the captured
    view already is what a replay would make; like a device graph, which records no task
    for either). A call that allocated, e.g. `contiguous` copying a strided input, runs."""
    if func.name() in ALLOCATIONS:
        return True
    if not func.is_view:
        return False
    inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
              if isinstance(t, torch.Tensor)}
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return bool(outputs) and all(t.untyped_storage().data_ptr() in inputs for t in outputs)


@functools.cache
def out_overload(func) -> Any:
    """The `out=` overload of an aten op taking the same arguments (`linear` ->
    `linear.out`), or None: a replay writes the result straight into the captured buffer,
    as a device kernel writes its graph-pool output, instead of a fresh tensor copied in."""
    want = [(a.name, str(a.type)) for a in func._schema.arguments]
    for name in func.overloadpacket.overloads():
        overload = getattr(func.overloadpacket, name)
        args = overload._schema.arguments
        outs = [a for a in args if a.is_out]
        if len(outs) == 1 and outs[0].name == "out" and outs[0].kwarg_only \
                and [(a.name, str(a.type)) for a in args if not a.is_out] == want:
            return overload
    return None
