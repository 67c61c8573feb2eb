"""The simulated NPU's streams and events: side-stream work really is deferred.

vLLM's V1 runner overlaps device->host copies with the next step under async scheduling
and speculative decoding: it issues `.to("cpu", non_blocking=True)` / `copy_(...,
non_blocking=True)` inside `torch.cuda.stream(side)`, records an event there, and reads
the host tensor only after `event.synchronize()`. On the simulated NPU every op would
finish at once, so a missing wait would go unnoticed. Here:

    default stream   synchronous with the host, as under ASCEND_LAUNCH_BLOCKING=1 (CANN
                     environment reference, "ASCEND_LAUNCH_BLOCKING": operators run
                     synchronously); a missing wait on it cannot be seen
    side stream      copies and fills issued on it are queued, their destinations hold
                     poison (int max / NaN) until the work runs; work runs when someone
                     waits: `Event.synchronize()`, `Stream.synchronize()`, a wait from
                     the default stream (`wait_stream`, `wait_event`) or a device-wide
                     synchronize. A host read before that reads poison (a wrong token or
                     an out-of-vocabulary error), never the right value by luck.

Queued copies read their source when they run (the latest moment a device could), so a
source overwritten before the wait also shows up. API and semantics follow torch_npu's
`torch.npu.Stream` / `torch.npu.Event` (torch_npu/csrc/npu/Event.cpp: enable_timing,
blocking, interprocess, graph_external), which mirror CUDA's stream/event model.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from vllm_npu.ops.sim.checks import NPUOpError

_lock = threading.RLock()
_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()
_ids = itertools.count(1)
_local = threading.local()


def poison_(t: torch.Tensor) -> torch.Tensor:
    """What a host buffer holds before the copy into it has run."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).max)


class Stream:
    """A simulated NPU stream (the default one when `default=True`)."""

    def __init__(self, device: Any = None, priority: int = 0, *, default: bool = False,
                 **kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority
        self.is_default = default
        self.stream_id = 0 if default else next(_ids)
        self._queue: list[tuple[int, Callable[[], None]]] = []
        self._issued = 0      # sequence number of the last work item queued
        self._completed = 0   # ... and of the last one run
        self._running = threading.RLock()  # one waiter runs the queue, in issue order
        with _lock:
            _streams.add(self)

    def __repr__(self) -> str:
        return f"<simulated NPU stream {self.stream_id}{' (default)' if self.is_default else ''}>"

    # ---- work -------------------------------------------------------------------------
    def enqueue(self, work: Callable[[], None]) -> None:
        if self.is_default:
            work()
            return
        # Device work has no autograd: it runs later under the mode it was issued in.
        inference = torch.is_inference_mode_enabled()

        def run() -> None:
            with torch.inference_mode(inference), torch.no_grad():
                work()

        with _lock:
            self._issued += 1
            self._queue.append((self._issued, run))

    def mark(self) -> int:
        return self._issued

    def run_until(self, seq: int) -> None:
        """Run this stream's queued work up to `seq` (in issue order, even when several
        threads wait at once: the async output thread and the next step)."""
        with self._running:
            while True:
                with _lock:
                    if not self._queue or self._queue[0][0] > seq:
                        return
                    number, work = self._queue.pop(0)
                work()
                with _lock:
                    self._completed = max(self._completed, number)

    def synchronize(self) -> None:
        self.run_until(self._issued)

    def query(self) -> bool:
        return not self._queue

    # ---- ordering between streams -----------------------------------------------------
    def wait_stream(self, other: "Stream") -> None:
        """Later work on self starts after all work issued on `other` so far."""
        event = Event()
        event.record(other)
        self.wait_event(event)

    def wait_event(self, event: "Event") -> None:
        if event._stream is None:
            return  # an unrecorded event is complete
        if self.is_default:
            event.synchronize()  # the default stream runs now, so its dependency must too
        else:
            self.enqueue(event.synchronize)

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event


class Event:
    """A simulated NPU event: marks a point in one stream's work."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, graph_external: bool = False, **kwargs) -> None:
        if interprocess:
            raise NPUOpError("simulated NPU events cannot be shared between processes "
                             "(interprocess=True)")
        self.enable_timing = enable_timing
        self._stream: Stream | None = None
        self._seq = 0
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or current_stream()
        self._stream, self._seq = stream, stream.mark()
        if self.enable_timing:
            stream.enqueue(self._stamp)

    def _stamp(self) -> None:
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.run_until(self._seq)

    def query(self) -> bool:
        return self._stream is None or self._stream._completed >= self._seq

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).wait_event(self)

    def elapsed_time(self, end: "Event") -> float:
        if self._time is None or end._time is None:
            raise NPUOpError("elapsed_time needs two recorded, completed events created "
                             "with enable_timing=True")
        return (end._time - self._time) * 1000.0


_DEFAULT = Stream(default=True)


def current_stream(device: Any = None) -> Stream:
    return getattr(_local, "stream", None) or _DEFAULT


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT


def set_stream(stream: Stream) -> None:
    _local.stream = stream


def synchronize_all() -> None:
    """Device-wide synchronize: every stream's queued work runs."""
    with _lock:
        streams = list(_streams)
    for s in streams:
        s.synchronize()


# ---- what runs on a side stream ---------------------------------------------------------
_VIEWS = {torch.Tensor.__getitem__, torch.Tensor.narrow, torch.Tensor.view,
          torch.Tensor.unsqueeze, torch.Tensor.squeeze, torch.Tensor.reshape,
          torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__len__,
          torch.Tensor.contiguous}
# New tensors: nothing else can read them before the stream's later (queued) work does.
_FACTORIES = {torch.tensor, torch.empty, torch.zeros, torch.ones, torch.full, torch.arange,
              torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like}


def _is_to_host(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, str):
        target = torch.device(target)
    return isinstance(target, torch.device) and target.type == "cpu"


class _SideStreamMode(TorchFunctionMode):
    """Inside `stream(side)`: copies and fills are queued on the side stream; anything
    else a device would run asynchronously there is refused (vLLM issues only copies)."""

    def __init__(self, stream: Stream) -> None:
        super().__init__()
        self.stream = stream

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func is torch.Tensor.to and _is_to_host(args, kwargs):
            src = args[0]
            out = poison_(torch.empty_like(src, device="cpu"))
            self.stream.enqueue(lambda: out.copy_(src))
            return out
        if func is torch.Tensor.copy_:
            dst, src = args[0], args[1]
            poison_(dst)
            self.stream.enqueue(lambda: dst.copy_(src))
            return dst
        if func in (torch.Tensor.__setitem__, torch.Tensor.fill_, torch.Tensor.zero_):
            self.stream.enqueue(lambda: func(*args, **kwargs))
            return args[0] if func is not torch.Tensor.__setitem__ else None
        if func in _VIEWS or func in _FACTORIES or name == "__get__":
            return func(*args, **kwargs)
        raise NPUOpError(f"simulated NPU: {name} issued on a side stream; the simulator "
                         "runs only copies and fills asynchronously there")


@contextlib.contextmanager
def stream(s: Stream | None):
    """`torch.cuda.stream(s)` for the simulated NPU."""
    if s is None:
        yield
        return
    before = getattr(_local, "stream", None)
    _local.stream = s
    try:
        if s.is_default:
            yield
        else:
            with _SideStreamMode(s):
                yield
    finally:
        _local.stream = before
