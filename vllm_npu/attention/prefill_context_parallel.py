"""Prefill context parallelism (PCP) on the NPU: a step's tokens split over the PCP ranks.

Every PCP rank receives the same batch of T tokens. Rank r runs the model on one
contiguous chunk of it, C = ceil(T / P) rows (padded at the tail), so embedding, MLP and
attention queries cost 1/P each; the final hidden states are all-gathered and, rank-major,
the first T rows are the batch in order. Equal chunks are the layout vLLM's MLA layer
assumes when it gathers new latents over PCP (`vllm/v1/attention/ops/pcp.py`).

    batch  | a0 a1 a2 a3 a4 b0 b1 c0 c1 c2 c3 c4 c5 |          P = 2, T = 13, C = 7
    rank 0 | a0 a1 a2 a3 a4 b0 b1 |                           pieces a[0:5] b[0:2]
    rank 1 | c0 c1 c2 c3 c4 c5 ## |                           piece  c[0:6], one pad row

Attention needs the keys of every earlier token: the new K/V of all chunks are gathered
and written to every rank's (replicated) KV cache, then each rank attends its local
queries over the paged cache. A request cut by the chunk becomes a "piece": its local
query rows [a, b) of the request's new tokens, with kv length = cached context + b, so
right-down causal masking gives each row exactly the keys up to its own position. A rank
whose chunk is empty (T < P * C) runs the batch's last token as a stand-in whose results
are dropped, so it still joins every layer's collectives.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

_active = False  # set while the runner's forward runs on this rank's chunk


def chunk_len(num_tokens: int, world: int) -> int:
    return -(-num_tokens // world)


def token_range(num_tokens: int, world: int, rank: int) -> tuple[int, int]:
    """The batch rows rank `rank` contributes: [start, end) (empty for trailing ranks)."""
    c = chunk_len(num_tokens, world)
    return min(rank * c, num_tokens), min((rank + 1) * c, num_tokens)


def run_range(num_tokens: int, world: int, rank: int) -> tuple[int, int]:
    """The batch rows the rank runs ahead of its padding: its chunk, or the last token as a
    stand-in when the chunk is empty."""
    start, end = token_range(num_tokens, world, rank)
    return (start, end) if end > start else (num_tokens - 1, num_tokens)


def pad_rows(x: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """x with its last row along `dim` repeated up to `rows` rows (the pad rows)."""
    missing = rows - x.shape[dim]
    if missing == 0:
        return x
    last = x.narrow(dim, x.shape[dim] - 1, 1)
    return torch.cat([x] + [last] * missing, dim=dim)


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
    num_tokens: int           # T, the whole batch
    chunk: int                # C rows every rank runs
    run: tuple[int, int]      # run_range: the rows its pieces cover, first in its chunk
    query_ends: list[int]     # cumulative local query rows per piece
    kv_lens: list[int]        # per piece: cached context + new tokens up to the piece's end
    rows: torch.Tensor        # int64 [pieces]: the piece's request (block table row)
    prefilling: torch.Tensor  # bool [pieces]: the piece's request is in prefill

    @property
    def num_run(self) -> int:
        return self.run[1] - self.run[0]


def build_pcp_metadata(query_start_loc: list[int], seq_lens: list[int], num_tokens: int,
                       world: int, rank: int) -> PCPMetadata:
    lo, hi = run_range(num_tokens, world, rank)
    ends, kv_lens, rows, prefilling = [], [], [], []
    for r, (q0, q1, seq) in enumerate(zip(query_start_loc, query_start_loc[1:], seq_lens)):
        a, b = max(q0, lo), min(q1, hi)
        if a >= b:
            continue
        ends.append((ends[-1] if ends else 0) + b - a)
        kv_lens.append(seq - (q1 - q0) + b - q0)
        rows.append(r)
        prefilling.append(q1 - q0 > 1)
    return PCPMetadata(num_tokens=num_tokens, chunk=chunk_len(num_tokens, world),
                       run=(lo, hi), query_ends=ends, kv_lens=kv_lens,
                       rows=torch.tensor(rows, dtype=torch.long),
                       prefilling=torch.tensor(prefilling, dtype=torch.bool))


def gather_chunks(group, x: torch.Tensor, pcp: PCPMetadata) -> torch.Tensor:
    """Every rank's chunk of x (rows first), gathered: the whole batch's T rows in order."""
    return group.all_gather(pad_rows(x[:pcp.chunk], pcp.chunk), dim=0)[:pcp.num_tokens]


def local_common_metadata(cm, pcp: PCPMetadata):
    """vLLM's CommonAttentionMetadata for this rank's pieces (each piece a request whose
    kv length ends at its last local token), for backends whose layer splits the batch
    itself (MLA: decodes, then prefills). The slot mapping stays the whole batch's: every
    rank writes every token."""
    lo, hi = pcp.run
    qsl = torch.tensor([0] + pcp.query_ends, dtype=torch.int32)
    kv = torch.tensor(pcp.kv_lens, dtype=torch.int32)
    device = cm.query_start_loc.device
    return dataclasses.replace(
        cm, query_start_loc=qsl.to(device), query_start_loc_cpu=qsl,
        seq_lens=kv.to(device), seq_lens_cpu_upper_bound=kv, num_reqs=len(pcp.kv_lens),
        num_actual_tokens=hi - lo, max_query_len=int((qsl[1:] - qsl[:-1]).max()),
        max_seq_len=int(kv.max()), block_table_tensor=cm.block_table_tensor[pcp.rows],
        positions=None if cm.positions is None else cm.positions[lo:hi],
        is_prefilling=pcp.prefilling.to(device))
