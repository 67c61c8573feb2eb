"""How a simulated graph task holds the arguments of its op call.

A device task keeps its kernel's launch arguments: raw addresses of device memory, and
its own copy of host-side data (sequence-length lists, host int32 tensors). `hold` turns
one argument of a call into what the task keeps (a `DeviceRef` per device tensor, a copy
of host data) and its layout, which an update must keep; `resolve` turns a held argument
back into tensors for a replay that runs the op, `addresses` lists the DeviceRefs a
prepared launch must find alive (graph.py).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from vllm_npu.ops.sim.checks import NPUOpError


class DeviceRef:
    """A device tensor as a task sees it: an address (storage, offset, sizes, strides),
    not an owner. Source: an ACL graph task stores the kernel's launch arguments, raw
    device pointers (CANN `aclmdlRICaptureTaskUpdateBegin/End` replace them); the caching
    allocator reuses a freed block for the next allocation, so a task whose workspace or
    output was freed reads or writes someone else's memory at replay. vllm-ascend keeps
    every such buffer alive in its graph params (`graph_params.workspaces[num_tokens]`)."""
    __slots__ = ("ref", "tensor", "ptr", "base", "nbytes", "offset", "shape", "stride",
                 "dtype")

    def __init__(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        self.ref = weakref.ref(storage)
        self.base, self.nbytes = storage.data_ptr(), storage.nbytes()
        # The caller's tensor while it lives (its storage then lives too): a replay uses it
        # as it is, where rebuilding a view on the storage costs ~3 us per argument.
        self.tensor = weakref.ref(t)
        self.ptr = t.data_ptr()
        self.offset, self.shape, self.stride = t.storage_offset(), tuple(t.shape), t.stride()
        self.dtype = t.dtype

    def get(self, op: str) -> torch.Tensor:
        t = self.tensor()
        if t is not None and t.data_ptr() == self.ptr and t.shape == self.shape \
                and t.stride() == self.stride:
            return t
        storage = self.ref()
        if storage is None:
            self._freed(op)
        return torch.empty(0, dtype=self.dtype).set_(storage, self.offset, self.shape,
                                                     self.stride)

    def same_as(self, t: torch.Tensor) -> bool:
        """t addresses this memory, still alive, with this layout (a task holding this
        reads t's data)."""
        storage = self.ref()
        return storage is not None and storage.data_ptr() == self.base and self._laid_out(t)

    def _laid_out(self, t: torch.Tensor) -> bool:
        """t starts at this address with this layout (its storage not looked at)."""
        return t.data_ptr() == self.ptr and tuple(t.shape) == self.shape \
            and t.stride() == self.stride and t.dtype == self.dtype

    def holds(self, t: torch.Tensor) -> bool:
        """`same_as`, answered without a storage lookup when t is the tensor held (which t
        becomes when it addresses this memory: the next call passes it again)."""
        if self.tensor() is t:
            return self._laid_out(t)
        if not self.same_as(t):
            return False
        self.tensor = weakref.ref(t)
        return True

    def check(self, op: str) -> None:
        """Refuses a launch on this address once its memory was freed, or moved or shrunk
        (a storage resized, e.g. by sleep mode) since the task was issued."""
        storage = self.ref()
        if storage is None or storage.data_ptr() != self.base or storage.nbytes() < self.nbytes:
            self._freed(op)

    def _freed(self, op: str) -> None:
        raise NPUOpError(f"graph replay: task {op} points at a freed {self.dtype} tensor "
                         f"of shape {self.shape}; keep every tensor a captured or "
                         "updated task uses (workspace, outputs, update arguments) alive "
                         "until the graph is replayed")


_SCALARS = (int, float, bool, str, type(None), torch.dtype)


def hold(value: Any, host: bool, task: bool, op: str, name: str) -> tuple[Any, Any]:
    """One argument of a call as its graph entry keeps it, and the argument's layout.

    Kept: a host argument (`host`) is copied, as a device task holds its own copy; with
    `task`, a device tensor is held by address (DeviceRef), otherwise as it is. Layout:
    what a task's launch configuration depends on, tensor shapes and dtypes and the
    lengths of host lists (not their values, which an update may change). A task refuses
    a zero-element tensor. Plain lists, tuples and dicts are walked here, other containers
    through pytree (a task update runs this over every argument, every step)."""
    if isinstance(value, torch.Tensor):
        if task and value.numel() == 0:
            raise NPUOpError(
                f"{op} in a graph task group with a zero-element {name} {tuple(value.shape)}: "
                "the device launches no kernel for an empty input (the group would hold no "
                "task, and every update would fail its task count); capture the task with "
                "the batch's rows")
        kept = value.clone() if host else DeviceRef(value) if task else value
        return kept, (tuple(value.shape), value.dtype)
    kind = type(value)
    if kind is list or kind is tuple:
        pairs = [hold(v, host, task, op, name) for v in value]
        return kind([kept for kept, _ in pairs]), kind([layout for _, layout in pairs])
    if kind is dict:
        pairs = {k: hold(v, host, task, op, name) for k, v in value.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(value, _SCALARS):
        return value, None
    leaves, spec = tree_flatten(value)
    if len(leaves) == 1 and leaves[0] is value:  # an object pytree does not open
        return value, None
    pairs = [hold(leaf, host, task, op, name) for leaf in leaves]
    return (tree_unflatten([kept for kept, _ in pairs], spec),
            tree_unflatten([layout for _, layout in pairs], spec))


def same_call(held: dict, call: dict, host_args: tuple[str, ...]) -> bool:
    """`call` (arguments by name) re-issues the task call `held` (its kept arguments by
    name) on the same memory: every device tensor at the address and with the layout held,
    host tensors of the held shape and dtype (their values may differ), every other
    argument an equal scalar. Such a re-issue can keep the task's launch and rewrite only
    its host data (graph.graph_op's `relaunch`)."""
    if held.keys() != call.keys():
        return False
    for name, value in call.items():
        kept = held[name]
        if type(kept) is DeviceRef:
            if not isinstance(value, torch.Tensor) or not kept.holds(value):
                return False
        elif name in host_args:
            if not isinstance(value, torch.Tensor) or not isinstance(kept, torch.Tensor) \
                    or value.shape != kept.shape or value.dtype != kept.dtype:
                return False
        elif type(value) is not type(kept) or not isinstance(value, _SCALARS) \
                or value != kept:
            return False
    return True


def resolve(value: Any, op: str) -> Any:
    """A task's argument at replay: each address back to a tensor (refusing freed memory)."""
    kind = type(value)
    if kind is DeviceRef:
        return value.get(op)
    if kind is list or kind is tuple:
        return kind([resolve(v, op) for v in value])
    if kind is dict:
        return {k: resolve(v, op) for k, v in value.items()}
    if isinstance(value, (torch.Tensor, *_SCALARS)):
        return value
    return tree_map(lambda v: v.get(op) if isinstance(v, DeviceRef) else v, value)


def addresses(value: Any) -> list[DeviceRef]:
    """The addresses (DeviceRef) among a task call's kept arguments."""
    kind = type(value)
    if kind is DeviceRef:
        return [value]
    if kind is list or kind is tuple:
        return [ref for v in value for ref in addresses(v)]
    if kind is dict:
        return [ref for v in value.values() for ref in addresses(v)]
    if isinstance(value, (torch.Tensor, *_SCALARS)):
        return []
    return [leaf for leaf in tree_leaves(value) if type(leaf) is DeviceRef]
