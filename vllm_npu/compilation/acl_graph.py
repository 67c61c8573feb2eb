"""ACLGraphWrapper: capture once per BatchDescriptor, replay afterwards.

vLLM hands the wrapper a runtime mode (FULL or PIECEWISE) at construction and, per
forward, a runtime mode and BatchDescriptor through the forward context:

    runtime mode != wrapper's mode      -> run eagerly (profile, warm-up, other wrapper)
    first call for a BatchDescriptor    -> capture the graph, return the capture's output
    later calls                         -> update the tasks, replay, return the captured
                                           output buffer (reused every replay)

Persistent input buffers are the runner's job (as for vLLM's CUDAGraphWrapper); attention
tasks are refreshed by the runner through `graph_params.update_attention_tasks` before a
FULL replay. The replay waits for the update through an ExternalEvent captured into the
graph (its wait and reset are the graph's first nodes; the update records it on the update
stream), the protocol of torch_npu's test_aclgraph_update.py and vllm-ascend.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import weakref
from typing import Any, Callable, ClassVar

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import BatchDescriptor, get_forward_context, is_forward_context_available

from vllm_npu.compilation.graph_backend import get_graph_backend

logger = logging.getLogger("vllm.npu")


@dataclasses.dataclass
class GraphStats:
    """Process-wide counters (tests read them; they are not log lines)."""
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    # replays per padded batch size (BatchDescriptor.num_tokens)
    replayed_sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass
class _Entry:
    graph: Any
    output: Any
    event: Any = None  # the ExternalEvent its captured wait blocks on (FULL with updates)


class GraphCaptureError(RuntimeError):
    pass


class ACLGraphWrapper:
    stats: ClassVar[GraphStats] = GraphStats()
    _pool: ClassVar[Any] = None  # one graph memory pool shared by every wrapper
    _live: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    def __init__(self, runnable: Callable[..., Any], vllm_config: VllmConfig,
                 runtime_mode: CUDAGraphMode, cudagraph_options: Any = None) -> None:
        if runtime_mode == CUDAGraphMode.NONE:
            raise ValueError("ACLGraphWrapper needs runtime_mode FULL or PIECEWISE")
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.backend = get_graph_backend()
        if ACLGraphWrapper._pool is None:
            ACLGraphWrapper._pool = self.backend.graph_pool_handle()
        self.entries: dict[BatchDescriptor, _Entry] = {}
        # FULL mode: the runner's task refresh, run before every replay (real and dummy
        # batches alike: a DP rank's dummy step replays too) with the graph's event, which
        # it records once the updates are issued.
        self.before_replay: Callable[[Any, Any], None] | None = None
        ACLGraphWrapper._live.add(self)

    @classmethod
    def release_graphs(cls, vllm_config: VllmConfig) -> None:
        """Drop the graphs of every wrapper of this engine (at its shutdown: the runner's
        `shutdown` says why)."""
        for wrapper in list(cls._live):
            if wrapper.vllm_config is vllm_config:
                wrapper.clear_graphs()

    def __getattr__(self, key: str) -> Any:
        runnable = self.__dict__.get("runnable")
        if runnable is not None and hasattr(runnable, key):
            return getattr(runnable, key)
        raise AttributeError(key)

    def unwrap(self) -> Callable[..., Any]:
        return self.runnable.unwrap() if hasattr(self.runnable, "unwrap") else self.runnable

    def has_graph(self, desc: BatchDescriptor | None) -> bool:
        return desc is not None and desc in self.entries

    def clear_graphs(self) -> None:
        self.entries.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        ctx = get_forward_context()
        desc, mode = ctx.batch_descriptor, ctx.cudagraph_runtime_mode
        if mode != self.runtime_mode or desc is None:
            ACLGraphWrapper.stats.eager_calls += 1
            return self.runnable(*args, **kwargs)
        entry = self.entries.get(desc)
        if entry is None:
            return self._capture(desc, args, kwargs)
        if entry.event is not None:
            self.before_replay(ctx, entry.event)
        entry.graph.replay()
        ACLGraphWrapper.stats.replays += 1
        ACLGraphWrapper.stats.replayed_sizes[desc.num_tokens] += 1
        return entry.output

    def _capture_failure(self, desc: BatchDescriptor, error: Exception) -> str:
        where = (f"ACL graph capture failed for {self.runtime_mode.name} batch of "
                 f"{desc.num_tokens} tokens (uniform decode={desc.uniform}): {error}.")
        sizes = sorted(self.vllm_config.compilation_config.cudagraph_capture_sizes or [])
        if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
            keep = [n for n in sizes if n < desc.num_tokens]
            return (f"{where} The graphs ran out of NPU memory; capture sizes {sizes}: "
                    f"drop {[n for n in sizes if n >= desc.num_tokens]} with "
                    f"--compilation-config '{{\"cudagraph_capture_sizes\": {keep}}}' (or "
                    "--max-num-seqs), leave more memory to the graphs with a lower "
                    "--gpu-memory-utilization, or run --enforce-eager")
        return (f"{where} Hint: run with --enforce-eager to confirm the model runs without "
                "graphs, or lower the capture sizes with --compilation-config "
                f"'{{\"cudagraph_capture_sizes\": [...]}}' (now {sizes}) / --max-num-seqs")

    def _capture(self, desc: BatchDescriptor, args: tuple, kwargs: dict) -> Any:
        graph = self.backend.new_graph()
        event = self.backend.new_event() if self.before_replay is not None else None
        try:
            with self.backend.capture(graph, ACLGraphWrapper._pool):
                if event is not None:  # every replay waits here for its task update
                    stream = self.backend.current_stream()
                    event.wait(stream)
                    event.reset(stream)
                output = self.runnable(*args, **kwargs)
        except Exception as e:
            raise GraphCaptureError(self._capture_failure(desc, e)) from e
        self.entries[desc] = _Entry(graph, output, event)
        ACLGraphWrapper.stats.captures += 1
        logger.debug("vllm_npu: captured %s graph for %s", self.runtime_mode.name, desc)
        return output
