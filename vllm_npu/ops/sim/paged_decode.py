"""One-query-token attention over a paged KV cache, read in place (no gathered copy).

The simulated decode kernels (ATB `_npu_paged_attention`, the single-token rows of
`npu_fused_infer_attention_score`, MLA decode) used to gather every request's blocks into
a padded [B, max_len, Hkv, D] copy and run dense attention on it: for a 128-request decode
batch that copy was half of the step. Here a numba loop walks each request's block table
and reads K/V rows where they lie, as the device kernels do.

Arithmetic in float32 (bf16 caches widened on load), softmax with the row maximum
subtracted; results within ~1e-6 of the dense float32 reference. float16 caches have no
numba type: the caller keeps the dense path for them (`supports`).
"""
from __future__ import annotations

import numba
import numpy as np
import torch
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

# bf16 is the top half of a float32: widening is a 16-bit shift of the bits.
_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def supports(*caches: torch.Tensor) -> bool:
    return all(c.dtype in _CACHE_DTYPES for c in caches) and len({c.dtype for c in caches}) == 1


@intrinsic
def _bits_as_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


def _f32(x):
    """A cache element as float32 (inside the kernel only)."""


@overload(_f32)
def _f32_impl(x):
    if x == types.float32:
        return lambda x: x
    if x == types.uint16:  # bf16 bits
        return lambda x: _bits_as_f32(np.uint32(x) << np.uint32(16))
    return None


@numba.njit(cache=True, nogil=True)
def _stage(cache, table_row, lo, hi, buf):
    """Rows [lo, hi) of one request's paged cache into buf[:hi - lo], one contiguous copy
    per block run: streaming copies keep the memory system busy where row-by-row reads
    of a cold cache would wait on each miss (measured in the engine: 1.6 ms warm, 4.2 ms
    cold per 128-request call without staging)."""
    bs = cache.shape[1]
    t = lo
    while t < hi:
        off = t % bs
        n = min(bs - off, hi - t)
        buf[t - lo:t - lo + n] = cache[table_row[t // bs], off:off + n]
        t += n


@numba.njit(cache=True, fastmath=True, nogil=True)
def _decode(q, q_rope, k_cache, k_rope, v_cache, table, kv_lens, first, scale, out, lse):
    """q [B, N, D] f32, q_rope [B, N, R] f32 (R may be 0); caches [blocks, bs, Hkv, *]
    float32 or uint16 (bf16 bits); keys [first[b], kv_lens[b]) of request b.
    Writes out [B, N, Dv] f32 and lse [B, N] f32 (-inf for a request with no key)."""
    B, N, D = q.shape
    R = q_rope.shape[2]
    bs, H, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    g = N // H
    longest = max(1, (kv_lens - first).max())
    # one request's keys transposed per head (scores become axpys over tokens), and its
    # values as stored
    keys = np.empty((H, D + R, longest), np.float32)
    vbuf = np.empty((longest, H, Dv), v_cache.dtype)
    scores = np.empty((g, longest), np.float32)
    acc = np.empty((g, Dv), np.float32)
    for b in range(B):
        lo, hi = first[b], kv_lens[b]
        n = hi - lo
        if n <= 0:
            out[b] = 0.0
            lse[b] = -np.inf
            continue
        for t in range(n):
            blk, off = table[b, (lo + t) // bs], (lo + t) % bs
            for h in range(H):
                for d in range(D):
                    keys[h, d, t] = _f32(k_cache[blk, off, h, d])
                for d in range(R):
                    keys[h, D + d, t] = _f32(k_rope[blk, off, h, d])
        _stage(v_cache, table[b], lo, hi, vbuf)
        for h in range(H):
            for j in range(g):
                row = scores[j, :n]
                row[:] = 0.0
                for d in range(D + R):
                    qd = (q[b, h * g + j, d] if d < D else q_rope[b, h * g + j, d - D]) * scale
                    kd = keys[h, d, :n]
                    for t in range(n):
                        row[t] += qd * kd[t]
                m = row.max()
                total = np.float32(0.0)
                for t in range(n):
                    x = row[t] - m  # below -80, exp is < 2e-35 of the max's 1: skip it,
                    row[t] = np.exp(x) if x > -80.0 else 0.0  # its denormals cost ~100x
                    total += row[t]
                lse[b, h * g + j] = m + np.log(total)
                row *= np.float32(1.0) / total
            acc[:] = 0.0
            for t in range(n):
                v = vbuf[t, h]
                for j in range(g):
                    p = scores[j, t]
                    a = acc[j]
                    for d in range(Dv):
                        a[d] += p * _f32(v[d])
            out[b, h * g:(h + 1) * g] = acc


_NUMPY = {torch.float32: np.float32, torch.bfloat16: np.uint16, torch.int32: np.int32,
          torch.int64: np.int64}


class _Raw:
    """A numpy view of a contiguous tensor's memory that leaves the tensor alone:
    `Tensor.numpy()` marks the storage non-resizable for good, which would break sleep
    mode's in-place `resize_` of the KV cache (worker/sleep.py)."""

    def __init__(self, t: torch.Tensor, shape: tuple[int, ...]) -> None:
        if not t.is_contiguous():
            raise ValueError(f"paged_decode needs contiguous tensors, got {tuple(t.shape)} "
                             f"with stride {t.stride()}")
        self.__array_interface__ = {
            "data": (t.data_ptr(), False), "shape": shape, "strides": None, "version": 3,
            "typestr": np.dtype(_NUMPY[t.dtype]).str}


def _array(t: torch.Tensor, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """`t` (bf16 as its uint16 bits, numpy has no bf16) as numpy, without copying."""
    shape = tuple(t.shape) if shape is None else shape
    if t.numel() == 0:  # no memory to share (and a null data pointer numpy refuses)
        return np.empty(shape, _NUMPY[t.dtype])
    return np.asarray(_Raw(t, shape))


def _cache(cache: torch.Tensor, heads: int) -> np.ndarray:
    """[blocks, bs, heads*D] or [blocks, bs, heads, D] -> [blocks, bs, heads, D]."""
    per_token = cache[0, 0].numel() if cache.shape[0] else 0
    return _array(cache, (cache.shape[0], cache.shape[1], heads, per_token // heads))


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 num_kv_heads: int, block_table: torch.Tensor, kv_lens: torch.Tensor,
                 scale: float, window: int | None = None,
                 query_rope: torch.Tensor | None = None,
                 key_rope: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query token per request over its first kv_lens[b] cached tokens
    (the last `window` + 1 of them with a sliding window: right-down causal band).

    query [B, N, D]; caches [num_blocks, block_size, Hkv*D] or [.., Hkv, D] (all one
    dtype, `supports`); block_table int32 [B, max_blocks]; kv_lens [B] ints. With
    query_rope [B, N, R] / key_rope (MLA): scores add query_rope . key_rope.
    Returns out [B, N, Dv] in query's dtype (zero rows where kv_len is 0) and lse [B, N]
    float32."""
    B, N, _ = query.shape
    lens = kv_lens.to(torch.int64).contiguous()
    first = (lens - 1 - window).clamp_(min=0) if window is not None \
        else torch.zeros_like(lens)
    qf = query.float().contiguous()
    qr = query_rope.float().contiguous() if query_rope is not None \
        else torch.empty(B, N, 0)
    k = _cache(key_cache, num_kv_heads)
    kr = _cache(key_rope, num_kv_heads) if key_rope is not None else k[..., :0]
    v = _cache(value_cache, num_kv_heads)
    out = torch.empty(B, N, v.shape[3], dtype=torch.float32)
    lse = torch.empty(B, N, dtype=torch.float32)
    _decode(_array(qf), _array(qr), k, kr, v, _array(block_table.contiguous()),
            _array(lens), _array(first), np.float32(scale), _array(out), _array(lse))
    return out.to(query.dtype), lse
