"""The parameter-update protocol of FULL graphs: what each attention layer captured, and
the refresh the runner runs before every replay.

A captured attention layer owns two tasks (KV-cache write, attention; `AttentionTasks`
here, `MLATasks` for the MLA backend's decode graphs) whose host-side arguments — slot
mapping, block table, sequence lengths — describe the capture's dummy batch. Before a
replay, `update_attention_tasks` re-issues both ops for the new batch on an update stream
(as the current stream, inside `task_update_begin/end`), then records an event that the
replay waits on. A
backend without `update_graph_params` cannot do this, and its builder declares no
FULL-graph support, so vLLM never gives it FULL mode.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from vllm.forward_context import BatchDescriptor, ForwardContext

from vllm_npu.compilation.graph_backend import get_graph_backend
from vllm_npu.ops.sim.task_args import DeviceRef


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionTasks:
    """One attention layer's tasks in one captured graph, with the buffers they read."""
    cache_write: Any            # task handle: _npu_reshape_and_cache (None: shared KV layer)
    attention: Any              # task handle: the attention op
    kind: Literal["paged_decode", "fused", "dcp"]  # dcp: `attention` = new-token task
    query: torch.Tensor         # [T, H, D]    captured input
    key: torch.Tensor | None    # [T, Hkv, D]  new tokens' K, captured input
    value: torch.Tensor | None  # [T, Hkv, D]
    kv_cache: torch.Tensor      # [num_blocks, 2, block_size, Hkv*D]
    output: torch.Tensor        # [T, H, D]    where the graph reads the result
    workspace: torch.Tensor | None = None  # the attention task's, alive as long as it
    dcp: Any = None             # backend.DCPTasks with DCP
    # where the cache-write task last read its slots and wrote the cache (list: refreshed
    # by each update that re-issues it)
    cache_refs: list[DeviceRef] = dataclasses.field(default_factory=list)


class GraphParams:
    """Captured attention tasks by BatchDescriptor, then layer name (one per process)."""

    def __init__(self) -> None:
        self._tasks: dict[BatchDescriptor, dict[str, AttentionTasks]] = {}
        self.updates = 0  # task refreshes issued (a counter for tests and benchmarks)

    def register(self, desc: BatchDescriptor, layer_name: str, tasks: AttentionTasks) -> None:
        self._tasks.setdefault(desc, {})[layer_name] = tasks

    def get(self, desc: BatchDescriptor) -> dict[str, AttentionTasks]:
        return self._tasks.get(desc, {})

    def clear(self) -> None:
        self._tasks.clear()


GRAPH_PARAMS = GraphParams()
_update_stream: Any = None


def update_attention_tasks(ctx: ForwardContext, layers: dict[str, Any], event: Any) -> None:
    """Refresh every captured attention task of ctx.batch_descriptor's graph for the batch
    in ctx.attn_metadata, then record `event` (the graph's captured wait) on the update
    stream; a graph without tasks gets the record alone."""
    global _update_stream
    backend = get_graph_backend()
    if _update_stream is None:
        _update_stream = backend.new_stream()
    tasks = GRAPH_PARAMS.get(ctx.batch_descriptor) or {}
    metadata = ctx.attn_metadata
    calls = []
    for layer_name, layer_tasks in tasks.items():
        meta = metadata[layer_name] if isinstance(metadata, dict) else metadata
        impl = layers[layer_name].impl
        # Device arguments an update needs are built here, on the compute stream: nothing
        # orders the update stream after it (ops/sim/update_stream.py).
        build = getattr(impl, "graph_update_args", None)
        extra = () if build is None else (build(layer_tasks, meta),)
        calls.append((impl, layer_tasks, meta, extra))
    # The re-issued ops must run on the update stream: issued on the current stream, a
    # device would run them right away and leave the update window empty.
    with backend.stream(_update_stream):
        for impl, layer_tasks, meta, extra in calls:
            impl.update_graph_params(backend, _update_stream, layer_tasks, meta, *extra)
            GRAPH_PARAMS.updates += 1
        event.record(_update_stream)
