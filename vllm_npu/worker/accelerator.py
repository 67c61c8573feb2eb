"""`torch.accelerator` calls inside the worker, on a CPU-only host.

vLLM's runner and loader call `torch.accelerator.synchronize()` / `empty_cache()` /
`empty_host_cache()`, which raise on a CPU build of torch. The simulated NPU has nothing
to synchronise or cache, so the worker runs its vLLM calls inside
`simulated_accelerator()`, which swaps in no-ops for the duration of the call only: the
rest of the process (API server, tests) keeps torch's own functions.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

_lock = threading.RLock()
_depth = 0
_saved: dict[str, object] = {}
_NOOPS = ("synchronize", "empty_cache", "empty_host_cache")


def _synchronize_noop(*args, **kwargs) -> None:
    """Simulated NPU: every op has completed when it returns."""


def _empty_cache_noop(*args, **kwargs) -> None:
    """Simulated NPU: no caching allocator to release."""


def _empty_host_cache_noop(*args, **kwargs) -> None:
    """Simulated NPU: no pinned-host cache either."""


@contextlib.contextmanager
def simulated_accelerator():
    global _depth
    with _lock:
        if _depth == 0:
            for name, fn in zip(_NOOPS, (_synchronize_noop, _empty_cache_noop,
                                              _empty_host_cache_noop)):
                _saved[name] = getattr(torch.accelerator, name)
                setattr(torch.accelerator, name, fn)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name in _NOOPS:
                    setattr(torch.accelerator, name, _saved.pop(name))


def on_simulated_device(method):
    """Decorator for worker methods: run inside `simulated_accelerator()` in simulation."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.simulated:
            return method(self, *args, **kwargs)
        with simulated_accelerator():
            return method(self, *args, **kwargs)

    return wrapper
