"""Attention test helpers: a batch's logical K/V scattered into a paged cache, and
plain-PyTorch references that read the logical K/V, never the cache, so a wrong block or
slot lookup in the code under test shows up."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from vllm.v1.kv_cache_interface import KVCacheLayout

BS = 128
MASK = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
}


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


# ----------------------------------------------------------------------------- fixtures


@dataclass
class Paged:
    """A batch's logical K/V and the same data scattered into a paged cache."""
    k: list[torch.Tensor]          # per request [kv_len, Hkv, D]
    v: list[torch.Tensor]
    key_cache: torch.Tensor        # [nb, BS, Hkv, D]
    value_cache: torch.Tensor
    block_table: torch.Tensor      # int32 [B, max_blocks]
    num_blocks: int

    def slot(self, b: int, pos: int) -> int:
        return int(self.block_table[b, pos // BS]) * BS + pos % BS


def make_paged(kv_lens, hkv, d, dtype, seed=0, spare_blocks=3) -> Paged:
    g = torch.Generator().manual_seed(seed)
    need = [max(1, -(-n // BS)) for n in kv_lens]
    nb = sum(need) + spare_blocks
    perm = torch.randperm(nb, generator=g)  # blocks of all requests shuffled together
    max_blocks = max(need) + 1
    # Unused table entries point at a spare block filled with garbage: never read.
    bt = torch.full((len(kv_lens), max_blocks), int(perm[-1]), dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    key_cache = (torch.randn(nb, BS, hkv, d, generator=g) * 50).to(dtype)  # garbage
    value_cache = (torch.randn(nb, BS, hkv, d, generator=g) * 50).to(dtype)
    ks, vs = [], []
    for b, n in enumerate(kv_lens):
        k = torch.randn(n, hkv, d, generator=g).to(dtype)
        v = torch.randn(n, hkv, d, generator=g).to(dtype)
        for p in range(n):
            blk, off = int(bt[b, p // BS]), p % BS
            key_cache[blk, off] = k[p]
            value_cache[blk, off] = v[p]
        ks.append(k)
        vs.append(v)
    return Paged(ks, vs, key_cache, value_cache, bt, nb)


def ref_attention(q, k, v, scale, window=None, want_lse=False):
    """q [q_len, N, D], k/v [kv_len, Hkv, D] -> out [q_len, N, D] (float32), lse [q_len, N].

    Right-down causal: query row i sees kv positions j <= kv_len - q_len + i, and with a
    window W also j > kv_len - q_len + i - W.
    """
    ql, N, D = q.shape
    kl, hkv = k.shape[0], k.shape[1]
    group = N // hkv
    head_of = torch.tensor([h // group for h in range(N)])   # query head -> kv head
    kh = k.float()[:, head_of].permute(1, 2, 0)                # [N, D, kl]
    vh = v.float()[:, head_of].transpose(0, 1)                 # [N, kl, Dv]
    scores = torch.bmm(q.float().transpose(0, 1), kh) * scale  # [N, ql, kl]
    last = (kl - ql + torch.arange(ql))[:, None]               # newest visible position
    j = torch.arange(kl)[None, :]
    allowed = j <= last
    if window is not None:
        allowed &= j > last - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1).transpose(0, 1)       # [ql, N]
    out = torch.bmm(torch.softmax(scores, dim=-1), vh).transpose(0, 1)
    return (out, lse) if want_lse else out


def ref_sdpa(q, k, v, scale):
    """Same causal rule through F.scaled_dot_product_attention with a boolean mask."""
    ql, N, _ = q.shape
    kl, hkv = k.shape[0], k.shape[1]
    kk = k.float().repeat_interleave(N // hkv, dim=1).transpose(0, 1)   # [N, kl, D]
    vv = v.float().repeat_interleave(N // hkv, dim=1).transpose(0, 1)
    i = torch.arange(ql)[:, None]
    j = torch.arange(kl)[None, :]
    mask = j <= kl - ql + i                                               # True = attend
    o = F.scaled_dot_product_attention(q.float().transpose(0, 1), kk, vv, attn_mask=mask,
                                       scale=scale)
    return o.transpose(0, 1)


def make_queries(q_lens, n, d, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(q_lens), n, d, generator=g).to(dtype)



SCENARIOS = {
    "prefill": ([5, 130], [5, 130]),
    "chunked_prefix_hit": ([3, 64], [131, 200]),
    "decode": ([1, 1, 1], [1, 128, 300]),
    "mixed": ([1, 7, 1, 20], [129, 7, 256, 40]),
    "ragged_decode": ([1, 1, 1, 1], [127, 128, 129, 257]),
    "ragged_prefill": ([127, 128, 129, 257], [127, 128, 129, 257]),
    "single_token": ([1], [1]),
    "empty_request_in_batch": ([4, 0, 2], [4, 9, 130]),
}
HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (4, 1)}


def alloc_kv_cache(num_blocks, hkv, d, dtype, layout=KVCacheLayout.LHBNC):
    """Per-layer cache with logical shape [num_blocks, 2, BS, Hkv*D] laid out as `layout`
    (LHBNC: separate K and V planes; LBHNC: block-compact pages, as hybrid models get)."""
    logical = (num_blocks, 2, BS, hkv * d)
    order = layout.layer_view_order       # physical order of logical axes
    physical = torch.zeros([logical[i] for i in order], dtype=dtype)
    inverse = [order.index(i) for i in range(4)]
    cache = physical.permute(*inverse)
    assert cache.shape == logical
    return cache
