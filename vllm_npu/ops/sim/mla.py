"""Simulated ATB ops for MLA's latent KV cache: `_npu_reshape_and_cache_siso` (write),
`_npu_paged_attention_mla` (decode over the latent cache) and
`npu_multi_head_latent_attention` (decode with split nope/rope inputs and an lse output,
for decode context parallelism).

One layer's latent cache, as vLLM allocates it for an MLA layer (one "head" per token):

    key_cache [num_blocks, block_size, 1, L + R]       L = kv_lora_rank, R = qk_rope_head_dim
                                      |-- kv_c (L) --|-- k_pe (R) --|
    slot s -> block s // block_size, offset s % block_size

Decode reads the same rows as keys (all L + R features) and as values (the first
`mla_vheadsize` = L features): with the absorbed query q = [q_nope @ W_UK | q_pe] of
width L + R, attention over the latent cache returns softmax(q . row) @ row[:L] per head.
Signatures follow torch_npu's ATB bindings (AtbOpsInterface.h); the limits enforced are
the documented ones of ATB PagedAttention's "MLA merged input" mode: MQA only (one kv
head), head size in (0, 576], mla_vheadsize <= head size, block_size <= 128 when the head
size exceeds 256, 0 < batch <= 8192, float16/bfloat16 (float32: simulation only).
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.attention import attend_padded, gather_paged
from vllm_npu.ops.sim.checks import NPUOpError, check_contiguous, check_dim, check_dtype

MLA_MAX_HEAD_SIZE = 576
MLA_MAX_BATCH = 8192
_WIDE_HEAD_MAX_BLOCK = 128  # head size > 256 needs block_size <= 128
_INT_MAX = 2147483647


def _check_slots(op: str, slot_indices: torch.Tensor, n: int, capacity: int) -> torch.Tensor:
    if slot_indices.dtype != torch.int32 or slot_indices.shape != (n,):
        raise NPUOpError(f"{op}: slot_indices must be int32 of shape ({n},), got "
                         f"{slot_indices.dtype} {tuple(slot_indices.shape)}")
    slots = slot_indices.long()
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
        raise NPUOpError(f"{op}: slot indices must lie in [0, {capacity}), got "
                         f"[{int(slots.min())}, {int(slots.max())}]")
    return slots


def _npu_reshape_and_cache_siso(key: torch.Tensor, key_cache: torch.Tensor,
                                slot_indices: torch.Tensor) -> None:
    """Single-input cache write: key [T, Hkv, D] -> key_cache [num_blocks, bs, Hkv, D]."""
    op = "_npu_reshape_and_cache_siso"
    check_dtype(op, "key", key)
    check_dtype(op, "key_cache", key_cache)
    check_dim(op, "key", key, 3)
    check_dim(op, "key_cache", key_cache, 4)
    check_contiguous(op, key_cache=key_cache)
    if key.dtype != key_cache.dtype:
        raise NPUOpError(f"{op}: key dtype {key.dtype} must match the cache dtype "
                         f"{key_cache.dtype}")
    if key.shape[1:] != key_cache.shape[2:]:
        raise NPUOpError(f"{op}: key {tuple(key.shape)} does not fit cache "
                         f"{tuple(key_cache.shape)}")
    capacity = key_cache.shape[0] * key_cache.shape[1]
    slots = _check_slots(op, slot_indices, key.shape[0], capacity)
    key_cache.view(capacity, *key_cache.shape[2:])[slots] = key


def _npu_paged_attention_mla(query: torch.Tensor, key_cache: torch.Tensor, num_kv_heads: int,
                             num_heads: int, scale_value: float, block_table: torch.Tensor,
                             context_lens: torch.Tensor, mla_vheadsize: int,
                             out: torch.Tensor) -> None:
    """Decode attention over the latent cache, written into `out` [B, N, mla_vheadsize].

    query [B, N, D] (one token per request), key_cache [num_blocks, bs, 1, D];
    context_lens: host int32 [B], the kv length of each request (new token included).
    """
    op = "_npu_paged_attention_mla"
    for name, t in (("query", query), ("key_cache", key_cache), ("out", out)):
        check_dtype(op, name, t)
    if not (query.dtype == key_cache.dtype == out.dtype):
        raise NPUOpError(f"{op}: query/key_cache/out dtypes differ: {query.dtype}, "
                         f"{key_cache.dtype}, {out.dtype}")
    check_dim(op, "query", query, 3)
    check_dim(op, "key_cache", key_cache, 4)
    check_contiguous(op, query=query, key_cache=key_cache, out=out)
    B, N, D = query.shape
    if num_kv_heads != 1:
        raise NPUOpError(f"{op}: the MLA merged-input mode is MQA only "
                         f"(num_kv_heads=1), got num_kv_heads={num_kv_heads}")
    if N != num_heads or key_cache.shape[2:] != (num_kv_heads, D):
        raise NPUOpError(f"{op}: query {tuple(query.shape)} and key_cache "
                         f"{tuple(key_cache.shape)} do not match num_heads={num_heads}, "
                         f"num_kv_heads={num_kv_heads}")
    if not 0 < D <= MLA_MAX_HEAD_SIZE:
        raise NPUOpError(f"{op}: head size {D} out of range (0, {MLA_MAX_HEAD_SIZE}]")
    if not 0 < mla_vheadsize <= D:
        raise NPUOpError(f"{op}: mla_vheadsize={mla_vheadsize} must lie in (0, {D}]")
    block_size = key_cache.shape[1]
    if D > 256 and block_size > _WIDE_HEAD_MAX_BLOCK:
        raise NPUOpError(f"{op}: head size {D} > 256 needs block_size <= "
                         f"{_WIDE_HEAD_MAX_BLOCK}, got {block_size}")
    if not 0 < B <= MLA_MAX_BATCH:
        raise NPUOpError(f"{op}: batch {B} out of range (0, {MLA_MAX_BATCH}]")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != B:
        raise NPUOpError(f"{op}: block_table must be int32 [B={B}, max_blocks], got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.device.type != "cpu" \
            or context_lens.shape != (B,):
        raise NPUOpError(f"{op}: context_lens must be a host int32 tensor of shape ({B},)")
    if out.shape != (B, N, mla_vheadsize):
        raise NPUOpError(f"{op}: out must be [{B}, {N}, {mla_vheadsize}], got "
                         f"{tuple(out.shape)}")
    lens = context_lens.long()
    if int(lens.min()) <= 0 or int(lens.max()) > block_table.shape[1] * block_size:
        raise NPUOpError(f"{op}: context lengths must lie in [1, "
                         f"{block_table.shape[1] * block_size}], got {lens.tolist()}")
    rows = gather_paged(key_cache.view(key_cache.shape[0], block_size, D), block_table, 1,
                        int(lens.max()))                            # [B, K, 1, D]
    ones = torch.ones(B, dtype=torch.long)
    o, _ = attend_padded(query.unsqueeze(1), rows, rows[..., :mla_vheadsize], ones, lens,
                         float(scale_value), True, _INT_MAX, 0)
    out.copy_(o[:, 0])


_MLA_CALC_TYPES = (None, "calc_type_undefined", "calc_type_ring")


def npu_multi_head_latent_attention(q_nope: torch.Tensor, q_rope: torch.Tensor,
                                    ctkv: torch.Tensor, k_rope: torch.Tensor,
                                    block_tables: torch.Tensor, context_lens,
                                    q_headnum: int, qk_scale: float, kv_headnum: int, *,
                                    calc_type: str | None = None, return_lse: bool = False,
                                    output: torch.Tensor | None = None,
                                    lse: torch.Tensor | None = None, **unsupported):
    """ATB MLA decode with split inputs ("krope_ctkv"), one query token per request.

    q_nope [B, N, L], q_rope [B, N, R]; ctkv [num_blocks, bs, 1, L], k_rope
    [num_blocks, bs, 1, R] (rows may be strided views of one latent cache: only the
    feature axis must be dense); context_lens: host ints [B], each request's kv length,
    0 allowed (a context-parallel rank holding none of the request: output 0, lse -inf).
    scores = (q_nope . ctkv + q_rope . k_rope) * qk_scale; output = softmax @ ctkv
    [B, N, L]. With calc_type "calc_type_ring" and return_lse, also lse [B, N, 1] in the
    query dtype, as the device writes it.
    """
    op = "npu_multi_head_latent_attention"
    used = {k: v for k, v in unsupported.items() if v is not None}
    if used:
        raise NotImplementedError(f"{op}: the simulator does not implement {sorted(used)}")
    if calc_type not in _MLA_CALC_TYPES:
        raise NPUOpError(f"{op}: calc_type={calc_type!r}; valid: {_MLA_CALC_TYPES}")
    if return_lse and calc_type != "calc_type_ring":
        raise NPUOpError(f"{op}: return_lse needs calc_type='calc_type_ring'")
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("ctkv", ctkv),
                    ("k_rope", k_rope)):
        check_dtype(op, name, t)
        if t.dtype != q_nope.dtype:
            raise NPUOpError(f"{op}: {name} dtype {t.dtype} != q_nope dtype {q_nope.dtype}")
        if t.stride(-1) != 1:
            raise NPUOpError(f"{op}: {name} must be dense along its last axis")
    check_dim(op, "q_nope", q_nope, 3)
    check_dim(op, "ctkv", ctkv, 4)
    check_contiguous(op, q_nope=q_nope, q_rope=q_rope)
    B, N, L = q_nope.shape
    R = q_rope.shape[-1]
    nb, bs = ctkv.shape[:2]
    if kv_headnum != 1 or N != q_headnum:
        raise NPUOpError(f"{op}: MQA only (kv_headnum=1) with q_headnum={N}; got "
                         f"kv_headnum={kv_headnum}, q_headnum={q_headnum}")
    if q_rope.shape != (B, N, R) or ctkv.shape != (nb, bs, 1, L) \
            or k_rope.shape != (nb, bs, 1, R):
        raise NPUOpError(f"{op}: shapes q_nope {tuple(q_nope.shape)}, q_rope "
                         f"{tuple(q_rope.shape)}, ctkv {tuple(ctkv.shape)}, k_rope "
                         f"{tuple(k_rope.shape)} do not fit [B, N, L] / [B, N, R] / "
                         "[blocks, bs, 1, L] / [blocks, bs, 1, R]")
    if L + R > MLA_MAX_HEAD_SIZE or bs > _WIDE_HEAD_MAX_BLOCK:
        raise NPUOpError(f"{op}: L+R={L + R} (max {MLA_MAX_HEAD_SIZE}), block_size={bs} "
                         f"(max {_WIDE_HEAD_MAX_BLOCK})")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 \
            or block_tables.shape[0] != B:
        raise NPUOpError(f"{op}: block_tables must be int32 [B={B}, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    lens = [int(n) for n in context_lens]
    if len(lens) != B or any(n < 0 or n > block_tables.shape[1] * bs for n in lens):
        raise NPUOpError(f"{op}: context_lens must be {B} host ints in [0, "
                         f"{block_tables.shape[1] * bs}], got {lens}")
    if output is not None and (output.shape != (B, N, L) or output.dtype != q_nope.dtype):
        raise NPUOpError(f"{op}: output must be [{B}, {N}, {L}] {q_nope.dtype}")
    if lse is not None and (lse.shape != (B, N, 1) or lse.dtype != q_nope.dtype):
        raise NPUOpError(f"{op}: lse must be [{B}, {N}, 1] {q_nope.dtype}")
    max_len = max(lens, default=0)
    c = gather_paged(ctkv.reshape(nb, bs, L), block_tables, 1, max_len)  # [B, K, 1, L]
    r = gather_paged(k_rope.reshape(nb, bs, R), block_tables, 1, max_len)
    keys = torch.cat((c, r), dim=-1)
    query = torch.cat((q_nope, q_rope), dim=-1).unsqueeze(1)
    o, lse_rows = attend_padded(query, keys, c, torch.ones(B, dtype=torch.long),
                                torch.tensor(lens), float(qk_scale), True, _INT_MAX, 0,
                                want_lse=return_lse)
    out = o[:, 0] if output is None else output.copy_(o[:, 0])
    if not return_lse:
        return out
    lse_out = lse_rows[:, 0].unsqueeze(-1).to(q_nope.dtype)
    if lse is not None:
        lse.copy_(lse_out)
        lse_out = lse
    return out, lse_out
