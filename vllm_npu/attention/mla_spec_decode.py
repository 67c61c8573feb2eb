"""MLA decode with several query tokens per request (speculative decoding's verification).

`npu_multi_head_latent_attention` takes one query token per request; a decode round that
verifies drafts carries 1 + k per request, causal among themselves. As vllm-ascend does
(attention/mla_v1.py `_forward_decode`, spec-decoding state), those rounds go through the
fused attention op in its MLA form: TND queries (absorbed nope [T, N, L] + `query_rope`
[T, N, R]) against the two latent planes (keys: nope + `key_rope`, values: nope), right-down
causal (sparse_mode 3 with the compressed mask), at most 16 query tokens per request.

In a captured FULL graph (uniform batches of u = 1 + k tokens per request) the task keeps
the capture's T tokens; a replayed batch with fewer requests is padded with requests of u
tokens over u positions of vLLM's null block (block 0), as vllm-ascend pads
`actual_seq_lengths_q` so that its last entry equals T; their outputs are never read.
"""
from __future__ import annotations

import torch



def query_ends_if_multi_token(query_start_loc_cpu: torch.Tensor, num_decodes: int):
    """Cumulative query ends of the decode requests (host list) when any has more than
    one token, else None (the single-token MLA op serves the round)."""
    if num_decodes == 0:
        return None
    qsl = query_start_loc_cpu[:num_decodes + 1]
    if int((qsl[1:] - qsl[:-1]).max()) <= 1:
        return None
    return qsl[1:].tolist()


def fia_args(q_nope: torch.Tensor, q_rope: torch.Tensor, nope: torch.Tensor,
             rope: torch.Tensor, block_table: torch.Tensor, seq_lens: list[int],
             query_ends: list[int], mask: torch.Tensor, scale: float) -> tuple[tuple, dict]:
    """The fused op's arguments over the latent planes ([nb, bs, 1, L] / [.., R])."""
    nb, bs = nope.shape[:2]
    keys = nope.view(nb, bs, -1)
    return (q_nope, keys, keys), dict(
        query_rope=q_rope, key_rope=rope.view(nb, bs, -1), num_heads=q_nope.shape[1],
        num_key_value_heads=1, input_layout="TND", atten_mask=mask, sparse_mode=3,
        scale=scale, block_table=block_table, block_size=bs,
        actual_seq_lengths=query_ends, actual_seq_lengths_kv=seq_lens)


def padded_batch(query_ends: list[int], seq_lens: list[int], block_table: torch.Tensor,
                 num_tokens: int, query_len: int):
    """A replayed batch filled up to the task's `num_tokens` with padding requests of
    `query_len` tokens (fewer for the last) over the null block: (ends, lens, table).
    vLLM's own padding requests (no query tokens) are dropped first: the capture's batch
    had none, so the task's argument list keeps the captured length."""
    starts = [0] + list(query_ends[:-1])
    real = [i for i, (s, e) in enumerate(zip(starts, query_ends)) if e > s]
    ends, lens = [query_ends[i] for i in real], [seq_lens[i] for i in real]
    block_table = block_table[real]
    while (ends[-1] if ends else 0) < num_tokens:
        q = min(query_len, num_tokens - (ends[-1] if ends else 0))
        ends.append((ends[-1] if ends else 0) + q)
        lens.append(q)
    table = block_table.new_zeros(len(ends), block_table.shape[1])
    table[:block_table.shape[0]] = block_table[:len(ends)]
    return ends, lens, table
