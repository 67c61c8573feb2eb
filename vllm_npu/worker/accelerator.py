"""The NPU runtime vLLM's worker code reaches through CUDA-named APIs, scoped to worker calls.

vLLM's V1 runner takes its streams and events from `torch.cuda` (`torch.cuda.Stream()`,
`torch.cuda.Event(blocking=True)`, `torch.cuda.current_stream()`, `with
torch.cuda.stream(s)`) and `torch.Event()`, and calls `torch.accelerator.synchronize()` /
`empty_cache()` / `empty_host_cache()` / `current_device_index()`. The worker runs its vLLM
calls inside `npu_runtime()`, which for the duration of the call only points those names at:

    real NPU       torch.npu's streams and events (torch_npu)
    simulated NPU  vllm_npu.ops.sim.streams (side-stream work really deferred) and
                   accelerator calls that synchronise those streams / trim the heap

Outside a worker call (API server, tests, other threads' code) torch's own functions
stay; `torch.cuda` is never rebound for the process. Objects created inside (the runner's
streams and events, vLLM's async outputs) keep working when used later from elsewhere.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

_lock = threading.RLock()
_depth = 0
_saved: list[tuple[object, str, object]] = []
_STREAM_API = ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream")


def _synchronize_streams(*args, **kwargs) -> None:
    """Simulated NPU: the default stream is done; queued side-stream work runs now."""
    from vllm_npu.ops.sim.streams import synchronize_all

    synchronize_all()


def _empty_cache(*args, **kwargs) -> None:
    """Simulated NPU: the heap that serves as device memory gives its free pages back."""
    from vllm_npu.ops.sim.memory import release_freed_heap

    release_freed_heap()


def _empty_host_cache_noop(*args, **kwargs) -> None:
    """Simulated NPU: no pinned-host cache either."""


def _current_device_index(*args, **kwargs) -> int:
    """Simulated NPU: one host device, index 0 (torch raises with no accelerator).

    vLLM's KV connectors read it at construction (Mooncake's worker passes it back to
    `current_platform.set_device`, a no-op in simulation)."""
    return 0


@functools.cache
def _replacements(simulated: bool) -> tuple[tuple[object, str, object], ...]:
    """The names swapped in (built once: the worker enters twice per step)."""
    if simulated:
        from vllm_npu.ops.sim import streams

        return ((torch.accelerator, "synchronize", _synchronize_streams),
                (torch.accelerator, "empty_cache", _empty_cache),
                (torch.accelerator, "empty_host_cache", _empty_host_cache_noop),
                (torch.accelerator, "current_device_index", _current_device_index),
                (torch, "Event", streams.Event),
                *((torch.cuda, name, getattr(streams, name)) for name in _STREAM_API))
    npu = torch.npu  # registered by torch_npu
    return tuple((torch.cuda, name, getattr(npu, name)) for name in _STREAM_API)


@contextlib.contextmanager
def npu_runtime(simulated: bool = True):
    """Re-entrant; the outermost entry swaps the names in, its exit restores them."""
    global _depth
    with _lock:
        if _depth == 0:
            for owner, name, fn in _replacements(simulated):
                _saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, fn)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                while _saved:
                    owner, name, fn = _saved.pop()
                    setattr(owner, name, fn)


def on_npu_runtime(method):
    """Decorator for worker methods: run inside `npu_runtime()`."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with npu_runtime(self.simulated):
            return method(self, *args, **kwargs)

    return wrapper
