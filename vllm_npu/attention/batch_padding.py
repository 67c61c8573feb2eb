"""Batch padding the NPU attention ops need: FIA in TND layout takes query ends whose last
entry is the query's T, so a batch with fewer real tokens than rows gains a padding
request, whose block-table row is vLLM's null block."""
from __future__ import annotations

import torch


def table_for(meta, requests: int) -> torch.Tensor:
    """The block table for `requests` rows: the batch's own, or (a padding request
    appended, eager runs only) with a zero row for it: vLLM's null block 0. Graph tasks
    only ever see the batch's own table, which outlives the replay."""
    table = meta.block_table
    if requests == table.shape[0]:
        return table
    return torch.cat((table, table.new_zeros(requests - table.shape[0], table.shape[1])))


def pad_query_ends(tokens: int, ends: list[int], kv_lens: list[int],
                   min_kv: int = 0) -> tuple[list[int], list[int]]:
    """FIA in TND layout needs the last query end to equal the query's T (CANN tiling:
    "queryT != last element of actualSequenceLengthQ"; vllm-ascend pads
    actual_seq_lengths_q so: attention_v1.py and its v2 speculators). A FULL graph
    replayed for fewer tokens than it captured ends with vLLM's zero-token padding
    requests: the last of them takes the tail rows (kv >= q, reading its block-table row);
    without one, a padding request is appended (eager only: a task update keeps the
    captured batch size). Their output rows are never read. `kv_lens` per request, each
    at least `min_kv` for the padding request."""
    pad = tokens - (ends[-1] if ends else 0)
    if pad <= 0:
        return ends, kv_lens
    if len(ends) > 1 and ends[-1] == ends[-2] or ends == [0]:
        return ends[:-1] + [tokens], kv_lens[:-1] + [max(pad, min_kv, kv_lens[-1])]
    return ends + [tokens], kv_lens + [max(pad, min_kv)]
