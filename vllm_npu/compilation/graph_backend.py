"""One interface over the two graph runtimes: torch_npu's ACL graphs, or the simulator's.

The wrapper, the runner and the attention backends call only this protocol; which
implementation answers is decided once, by `vllm_npu.device.select_backend()`.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Protocol


class GraphBackend(Protocol):
    def new_graph(self) -> Any: ...
    def graph_pool_handle(self) -> Any: ...
    def capture(self, graph: Any, pool: Any) -> contextlib.AbstractContextManager: ...
    def is_capturing(self) -> bool: ...
    def task_group_begin(self, stream: Any) -> None: ...
    def task_group_end(self, stream: Any) -> Any: ...
    def task_update_begin(self, stream: Any, handle: Any) -> None: ...
    def task_update_end(self, stream: Any) -> None: ...
    def new_stream(self) -> Any: ...
    def current_stream(self) -> Any: ...
    def stream(self, stream: Any) -> contextlib.AbstractContextManager: ...
    def new_event(self) -> Any: ...
    def host_work(self) -> contextlib.AbstractContextManager: ...


class SimGraphBackend:
    """The simulated NPU: strict capture/replay of `vllm_npu.ops.sim.graph`."""

    def __init__(self) -> None:
        from vllm_npu.ops.sim import graph

        self._g = graph

    def new_graph(self):
        return self._g.SimGraph()

    def graph_pool_handle(self):
        return None  # captured buffers live as long as their graph

    @contextlib.contextmanager
    def capture(self, graph, pool) -> Iterator[None]:
        graph.capture_begin(pool)
        try:
            yield
        except BaseException:
            graph.capture_end(aborted=True)
            raise
        graph.capture_end()

    def is_capturing(self) -> bool:
        return self._g.is_capturing()

    def task_group_begin(self, stream) -> None:
        self._g.graph_task_group_begin(stream)

    def task_group_end(self, stream):
        return self._g.graph_task_group_end(stream)

    def task_update_begin(self, stream, handle) -> None:
        self._g.graph_task_update_begin(stream, handle)

    def task_update_end(self, stream) -> None:
        self._g.graph_task_update_end(stream)

    def new_stream(self):
        return self._g.SimStream()

    def current_stream(self):
        return self._g.current_stream()

    def stream(self, stream):
        return self._g.use_stream(stream)

    def new_event(self):
        return self._g.ExternalEvent()

    def host_work(self):
        return self._g.host_work()


class NPUGraphBackend:
    """A real NPU: torch_npu's NPUGraph, task groups and task updates."""

    def __init__(self) -> None:
        import torch
        import torch_npu  # noqa: F401

        self._npu = torch.npu

    def new_graph(self):
        return self._npu.NPUGraph()

    def graph_pool_handle(self):
        return self._npu.graph_pool_handle()

    def capture(self, graph, pool):
        return self._npu.graph(graph, pool=pool)

    def is_capturing(self) -> bool:
        return self._npu.is_current_stream_capturing()

    def task_group_begin(self, stream) -> None:
        self._npu.graph_task_group_begin(stream)

    def task_group_end(self, stream):
        return self._npu.graph_task_group_end(stream)

    def task_update_begin(self, stream, handle) -> None:
        self._npu.graph_task_update_begin(stream, handle)

    def task_update_end(self, stream) -> None:
        self._npu.graph_task_update_end(stream)

    def new_stream(self):
        return self._npu.Stream()

    def current_stream(self):
        return self._npu.current_stream()

    def stream(self, stream):
        return self._npu.stream(stream)

    def new_event(self):
        return self._npu.ExternalEvent()

    def host_work(self):
        return contextlib.nullcontext()  # ops on host tensors never enter an NPU graph


@functools.cache
def get_graph_backend() -> GraphBackend:
    from vllm_npu.device import select_backend

    return SimGraphBackend() if select_backend().simulated else NPUGraphBackend()
