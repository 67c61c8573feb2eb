"""Memory accounting for the simulated NPU, whose "device memory" is host memory.

The simulated device has a fixed capacity (NPU_SIM_MEMORY_GB). What lives on it is
tracked explicitly: tensors registered as resident (weights, KV cache) and, during the
profile run, the peak of activation bytes, measured by a dispatch mode that follows every
op's outputs until their last Python reference dies. Temporaries inside one simulated
kernel are not counted: on a device they live in the kernel's on-chip workspace.

Where the bytes come from: a device's framework allocates device memory through a caching
allocator (torch_npu's NPUCachingAllocator) that keeps freed blocks for the next op; the
simulated device's tensors come from the host's heap, whose allocator (glibc, by
default) maps a large allocation anew or takes it from fresh pages, and gives the heap's
free top back to the OS: an eager prefill's 8-16 MiB activations were faulted in, page by
page, on every forward. `keep_freed_heap` makes the heap keep and reuse them as the
caching allocator does (a 64 x 512-token prefill's gate/up projection, 16 MiB out: 9.3 ->
5.5 ms per call in the engine; test_worker_parts.py counts the page faults). The setting
is the process's: the simulated device shares its heap with the host code.
"""
from __future__ import annotations

import ctypes
import logging
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

logger = logging.getLogger("vllm.npu")

_resident: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# allocations up to this size come from the heap (larger ones, a KV cache, are mapped on
# their own and returned when freed); free memory at the heap's top is kept up to
# HEAP_KEEP_FREE
HEAP_MAX_ALLOCATION = 256 << 20
HEAP_KEEP_FREE = 1 << 30


def keep_freed_heap() -> bool:
    """Keep the process heap's freed memory for reuse (see the module doc). True where the
    C library took the settings (glibc); elsewhere nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        logger.debug("vllm_npu: no mallopt in this C library; heap left as it is")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the mmap threshold first: setting either fixes both (glibc stops adapting them)
    if mallopt(_M_MMAP_THRESHOLD, HEAP_MAX_ALLOCATION) != 1 \
            or mallopt(_M_TRIM_THRESHOLD, HEAP_KEEP_FREE) != 1:
        logger.warning("vllm_npu: the C library refused the heap settings; large simulated "
                       "device tensors are faulted in on every allocation")
        return False
    return True


def release_freed_heap() -> bool:
    """Give the heap's free pages back to the OS (glibc's malloc_trim(0), every arena):
    the simulated `torch.accelerator.empty_cache()`, as a device's caching allocator
    returns its unused blocks. vLLM calls it at startup points and in
    `cleanup_dist_env_and_memory` after an engine's shutdown: without it a process that
    ran several engines kept the largest heap any of them reached. False where the C
    library has no malloc_trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


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
