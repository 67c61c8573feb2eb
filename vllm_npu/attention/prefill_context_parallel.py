"""Prefill context parallelism (PCP) on the NPU: a step's tokens split over the PCP ranks.

Every PCP rank receives the same batch. The runner hands each rank one contiguous slice
of the batch's T tokens (`token_range`), runs the model on that slice only (embedding,
MLP, norms and attention queries: 1/P of the work each) and all-gathers the final hidden
states, so logits and sampling see the whole batch on every rank.

Attention needs the keys of every earlier token: each layer all-gathers the slice's new
K/V, writes all T tokens into the (replicated) KV cache, then attends its local queries
over the paged cache. A request cut by the slice becomes a "piece": its local query rows
[a, b) of the request's new tokens, with kv length = cached context + b, so right-down
causal masking gives each row exactly the keys up to its own position.

    batch    | a0 a1 a2 a3 a4 | b0 b1 | c0 c1 c2 c3 c4 c5 |      (P = 2, T = 13)
    rank 0   | a0 a1 a2 a3 a4   b0 b1   c0 |                     pieces a[0:5] b[0:2] c[0:1]
    rank 1                                 | c1 c2 c3 c4 c5 |    piece  c[1:6]
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

_active = False  # set while the runner's forward runs on this rank's slice


def token_range(num_tokens: int, world: int, rank: int) -> tuple[int, int]:
    """This rank's contiguous slice of num_tokens: the first num_tokens % world ranks
    take one token more."""
    base, extra = divmod(num_tokens, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def slice_sizes(num_tokens: int, world: int) -> list[int]:
    return [b - a for a, b in (token_range(num_tokens, world, r) for r in range(world))]


@contextlib.contextmanager
def slice_active():
    global _active
    _active, before = True, _active
    try:
        yield
    finally:
        _active = before


def is_slice_active() -> bool:
    return _active


@dataclass(frozen=True, slots=True)
class PCPMetadata:
    """This rank's query pieces of one step (host-side, built once per step)."""
    start: int
    end: int
    sizes: list[int]          # every rank's slice length (for the all-gathers)
    query_ends: list[int]     # cumulative local query rows per piece
    kv_lens: list[int]        # per piece: cached context + new tokens up to the piece's end
    rows: torch.Tensor        # int64 [pieces]: the piece's request (block table row)


def build_pcp_metadata(query_start_loc: list[int], seq_lens: list[int], num_tokens: int,
                       world: int, rank: int) -> PCPMetadata:
    start, end = token_range(num_tokens, world, rank)
    ends, kv_lens, rows = [], [], []
    for r, (q0, q1, seq) in enumerate(zip(query_start_loc, query_start_loc[1:], seq_lens)):
        a, b = max(q0, start), min(q1, end)
        if a >= b:
            continue
        context = seq - (q1 - q0)
        ends.append((ends[-1] if ends else 0) + b - a)
        kv_lens.append(context + b - q0)
        rows.append(r)
    return PCPMetadata(start=start, end=end, sizes=slice_sizes(num_tokens, world),
                       query_ends=ends, kv_lens=kv_lens,
                       rows=torch.tensor(rows, dtype=torch.long))
