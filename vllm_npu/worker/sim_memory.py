"""Memory accounting for the simulated NPU, whose "device memory" is host memory.

The simulated device has a fixed capacity (NPU_SIM_MEMORY_GB). What lives on it is
tracked explicitly: tensors registered as resident (weights, KV cache) and, during the
profile run, the peak of activation bytes, measured by a dispatch mode that follows every
op's outputs until their last Python reference dies. Temporaries inside one simulated
kernel are not counted: on a device they live in the kernel's on-chip workspace.
"""
from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_resident: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def register_resident(tensors) -> None:
    """Count these tensors' storages as device memory while they are alive."""
    for t in tensors:
        _resident[t.untyped_storage().data_ptr()] = t


def live_device_bytes() -> int:
    seen: dict[int, int] = {}
    for t in list(_resident.values()):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


class PeakMemoryTracker(TorchDispatchMode):
    """Tracks bytes of op outputs alive at once; `peak` is the high-water mark."""

    def __init__(self, ignore: set[int] = frozenset()) -> None:
        super().__init__()
        self._ignore = ignore  # storages already resident (weights): in-place ops return them
        self._refs: Counter[int] = Counter()
        self._sizes: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.current -= self._sizes.pop(key)

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or key in self._ignore:
            return
        if key not in self._sizes:
            self._sizes[key] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        self._refs[key] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        return out
