"""Simulated DeepSeek-V3.2 sparse attention: the lightning indexer (which keys each query
token attends) and sparse flash attention over the MLA latent cache at those keys.

Names, arguments and limits follow the AscendC kernels vllm-ascend builds and calls for
DeepSeek-V3.2 on A2/A3 (`torch.ops._C_ascend.npu_lightning_indexer` /
`npu_sparse_flash_attention`, vllm-ascend csrc/torch_binding.cpp and
csrc/attention/{lightning_indexer,sparse_flash_attention}/: README.md, op_host/*_tiling.cpp,
op_kernel/arch22/*; called in vllm_ascend/device/device_op.py), in the one form vllm-ascend
uses: TND queries (cumulative `actual_seq_lengths_query`), paged PA_BSND keys (per-request
`actual_seq_lengths_key` / `_kv`, `block_table`). Both ops read the lengths and the block
table as device int32 tensors, so a captured graph replays them with each step's values.

Lightning indexer, per query token t of request b (query row r of S1, key length S2):
    score_j = sum_h weights[t, h] * ReLU(query[t, h] . key_j)     (no scale inside the op)
    visible j: j <= S2 - S1 + r (sparse_mode 3, bottom-right causal) or j < S2 (mode 0)
    indices[t, 0, :] = the top min(sparse_count, visible) j by score, then -1
Indices are positions in the request's key sequence, not cache slots: the kernels map them
through `block_table` themselves.

Sparse flash attention (attention_mode 2, MLA absorbed), per token t and head h:
    keys j = the row's indices up to the first -1, those below S2 - S1 + r + 1 (mode 3)
    out[t, h] = softmax_j(scale * ([query; query_rope][t, h] . [key; key_rope]_j)) @ value_j
key and value are the 512-wide latent plane (one kv head), key_rope the 64-wide rope plane;
a row with no key left gives zeros (the kernel's DealActSeqLenIsZero).
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_dim, check_dtype

LI_HEAD_DIM = 128          # lightning_indexer_tiling: HEAD_DIM_LIMIT
LI_MAX_QUERY_HEADS = 64    # QUERY_HEAD_NUM_LIMIT (N1 <= 64, one key head)
LI_MAX_SPARSE_COUNT = 2048  # above it only multiples of 1024
SFA_LATENT, SFA_ROPE = 512, 64  # sparse_flash_attention_tiling: D 512, rope 64
SFA_GROUPS = (1, 2, 4, 8, 16, 32, 64, 128)  # query heads per kv head
SPARSE_MODES = (0, 3)      # defaultMask, rightDownCausal
_PA_BLOCK_MULTIPLE, _PA_BLOCK_MAX = 16, 1024


def _check_layouts(op: str, layout_query: str, layout_key: str) -> None:
    # The device also takes BSND queries and BSND / TND keys; the plugin calls TND +
    # PA_BSND only, and the simulator implements only that pair.
    if layout_query not in ("BSND", "TND") or layout_key not in ("PA_BSND", "BSND", "TND"):
        raise NPUOpError(f"{op}: layouts {layout_query!r} / {layout_key!r}; valid: query "
                         "BSND or TND, key PA_BSND, BSND or TND")
    if (layout_query, layout_key) != ("TND", "PA_BSND"):
        raise NotImplementedError(f"{op}: the simulator implements TND queries over "
                                  f"PA_BSND keys only, not {layout_query} / {layout_key}")


def _check_paged(op: str, cache: torch.Tensor, name: str, width: int,
                 block_table, lens_q, lens_k) -> None:
    check_dim(op, name, cache, 4)
    if cache.shape[2] != 1 or cache.shape[3] != width:
        raise NPUOpError(f"{op}: {name} {tuple(cache.shape)} must be [blocks, block_size, 1, "
                         f"{width}] (one key head of {width})")
    bs = cache.shape[1]
    if bs % _PA_BLOCK_MULTIPLE or not 0 < bs <= _PA_BLOCK_MAX:
        raise NPUOpError(f"{op}: block_size {bs} must be a multiple of {_PA_BLOCK_MULTIPLE} "
                         f"up to {_PA_BLOCK_MAX}")
    for arg, t in (("block_table", block_table), ("actual_seq_lengths_query", lens_q),
                   ("actual_seq_lengths_key", lens_k)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise NPUOpError(f"{op}: {arg} must be an int32 tensor with TND / PA_BSND, got "
                             f"{type(t).__name__ if t is None else t.dtype}")
    check_dim(op, "block_table", block_table, 2)
    if not (lens_q.numel() == lens_k.numel() == block_table.shape[0]):
        raise NPUOpError(f"{op}: {lens_q.numel()} query lengths, {lens_k.numel()} key "
                         f"lengths and {block_table.shape[0]} block-table rows must agree")


def _requests(lens_q: torch.Tensor, lens_k: torch.Tensor, num_tokens: int, op: str):
    """(first token, query length, key length) per request from cumulative query ends."""
    ends, keys = lens_q.tolist(), lens_k.tolist()
    if ends and (ends[-1] != num_tokens or any(b < a for a, b in zip([0] + ends, ends))):
        raise NPUOpError(f"{op}: actual_seq_lengths_query {ends} must rise to the "
                         f"{num_tokens} query tokens (TND: cumulative)")
    start = 0
    for end, s2 in zip(ends, keys):
        if end - start > s2:
            raise NPUOpError(f"{op}: a request has {end - start} query tokens but key length "
                             f"{s2}")
        yield start, end - start, s2
        start = end


def _gather(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """A request's first `length` rows of a paged [blocks, bs, 1, D] cache -> [length, D]."""
    bs = cache.shape[1]
    need = -(-length // bs)
    if need > table_row.shape[0]:
        raise NPUOpError(f"block_table has {table_row.shape[0]} blocks per request; a key "
                         f"length of {length} needs {need} of {bs}")
    blocks = table_row[:need].long()
    return cache[blocks].reshape(-1, cache.shape[-1])[:length]


def _visible(s1: int, s2: int, sparse_mode: int, device=None) -> torch.Tensor:
    """Per query row r, how many leading keys it sees: [s1]."""
    rows = torch.arange(s1, device=device)
    return rows + (s2 - s1 + 1) if sparse_mode == 3 else torch.full((s1,), s2, device=device)


def npu_lightning_indexer(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, *,
                          actual_seq_lengths_query: torch.Tensor,
                          actual_seq_lengths_key: torch.Tensor, block_table: torch.Tensor,
                          layout_query: str = "TND", layout_key: str = "PA_BSND",
                          sparse_count: int = 2048, sparse_mode: int = 3,
                          return_value: bool = False):
    """query [T, N1, 128], key [blocks, bs, 1, 128], weights [T, N1] ->
    (sparse_indices int32 [T, 1, sparse_count], sparse_values: empty, as in inference)."""
    op = "npu_lightning_indexer"
    _check_layouts(op, layout_query, layout_key)
    check_dim(op, "query", query, 3)
    check_dim(op, "weights", weights, 2)
    for name, t in (("query", query), ("key", key), ("weights", weights)):
        check_dtype(op, name, t)
        if t.numel() == 0:
            raise NPUOpError(f"{op}: {name} is empty {tuple(t.shape)}")
    if key.dtype != query.dtype:
        raise NPUOpError(f"{op}: key dtype {key.dtype} != query dtype {query.dtype}")
    if weights.dtype not in (query.dtype, torch.float32):
        raise NPUOpError(f"{op}: weights dtype {weights.dtype}: the query's or float32")
    tokens, heads, dim = query.shape
    if dim != LI_HEAD_DIM or not 0 < heads <= LI_MAX_QUERY_HEADS:
        raise NPUOpError(f"{op}: query [T, N1, D] = {tuple(query.shape)}; the kernel takes "
                         f"D {LI_HEAD_DIM} and 1..{LI_MAX_QUERY_HEADS} heads")
    if weights.shape != (tokens, heads):
        raise NPUOpError(f"{op}: weights {tuple(weights.shape)} must be [T, N1] = "
                         f"{(tokens, heads)}")
    _check_paged(op, key, "key", LI_HEAD_DIM, block_table, actual_seq_lengths_query,
                 actual_seq_lengths_key)
    if not (0 < sparse_count <= LI_MAX_SPARSE_COUNT or (sparse_count > 0
                                                         and sparse_count % 1024 == 0)):
        raise NPUOpError(f"{op}: sparse_count {sparse_count}; valid: 1..{LI_MAX_SPARSE_COUNT}"
                         " or a multiple of 1024")
    if sparse_mode not in SPARSE_MODES:
        raise NPUOpError(f"{op}: sparse_mode {sparse_mode}; valid: {SPARSE_MODES}")
    if return_value:
        raise NPUOpError(f"{op}: return_value=True is for training layouts (not PA_BSND)")
    device = query.device  # a device runs this twin too (device_ops)
    out = torch.full((tokens, 1, sparse_count), -1, dtype=torch.int32, device=device)
    for b, (t0, s1, s2) in enumerate(_requests(actual_seq_lengths_query,
                                               actual_seq_lengths_key, tokens, op)):
        if s1 == 0:
            continue
        k = _gather(key, block_table[b], s2).float()                     # [S2, D]
        q = query[t0:t0 + s1].float()                                     # [S1, N1, D]
        scores = torch.einsum("shd,jd->shj", q, k).relu_()
        scores = torch.einsum("shj,sh->sj", scores, weights[t0:t0 + s1].float())
        visible = _visible(s1, s2, sparse_mode, device)
        scores.masked_fill_(torch.arange(s2, device=device) >= visible.unsqueeze(1),
                            float("-inf"))
        top = torch.topk(scores, min(sparse_count, s2), dim=-1)
        picked = top.indices.to(torch.int32).masked_fill_(top.values == float("-inf"), -1)
        out[t0:t0 + s1, 0, :picked.shape[1]] = picked
    return out, query.new_empty(0)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def npu_sparse_flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               sparse_indices: torch.Tensor, scale_value: float, *,
                               block_table: torch.Tensor,
                               actual_seq_lengths_query: torch.Tensor,
                               actual_seq_lengths_kv: torch.Tensor,
                               query_rope: torch.Tensor, key_rope: torch.Tensor,
                               sparse_block_size: int = 1, layout_query: str = "TND",
                               layout_kv: str = "PA_BSND", sparse_mode: int = 3,
                               attention_mode: int = 2, return_softmax_lse: bool = False):
    """query [T, N1, 512], query_rope [T, N1, 64], key = value [blocks, bs, 1, 512],
    key_rope [blocks, bs, 1, 64], sparse_indices int32 [T, 1, K] ->
    (attention_out [T, N1, 512], softmax_max, softmax_sum: empty without lse)."""
    op = "npu_sparse_flash_attention"
    _check_layouts(op, layout_query, layout_kv)
    if attention_mode != 2:
        raise NPUOpError(f"{op}: attention_mode {attention_mode}; only 2 (MLA absorbed)")
    if sparse_mode not in SPARSE_MODES:
        raise NPUOpError(f"{op}: sparse_mode {sparse_mode}; valid: {SPARSE_MODES}")
    if return_softmax_lse:
        raise NPUOpError(f"{op}: return_softmax_lse is for training layouts (not PA_BSND)")
    if query_rope is None or key_rope is None:
        raise NPUOpError(f"{op}: query_rope and key_rope are required (rope cannot be empty)")
    for name, t in (("query", query), ("key", key), ("value", value),
                    ("query_rope", query_rope), ("key_rope", key_rope)):
        check_dtype(op, name, t)
        if t.dtype != query.dtype:
            raise NPUOpError(f"{op}: {name} dtype {t.dtype} != query dtype {query.dtype}")
    check_dim(op, "query", query, 3)
    tokens, heads, dim = query.shape
    if dim != SFA_LATENT or query_rope.shape != (tokens, heads, SFA_ROPE):
        raise NPUOpError(f"{op}: query {tuple(query.shape)} / query_rope "
                         f"{tuple(query_rope.shape)}; the kernel takes D {SFA_LATENT} and "
                         f"rope {SFA_ROPE}")
    if heads not in SFA_GROUPS:
        raise NPUOpError(f"{op}: {heads} query heads per kv head; valid: {SFA_GROUPS}")
    _check_paged(op, key, "key", SFA_LATENT, block_table, actual_seq_lengths_query,
                 actual_seq_lengths_kv)
    _check_paged(op, key_rope, "key_rope", SFA_ROPE, block_table, actual_seq_lengths_query,
                 actual_seq_lengths_kv)
    if value.shape != key.shape or key_rope.shape[:2] != key.shape[:2]:
        raise NPUOpError(f"{op}: value {tuple(value.shape)} and key_rope "
                         f"{tuple(key_rope.shape)} must page like key {tuple(key.shape)}")
    if sparse_indices.dtype != torch.int32 or sparse_indices.dim() != 3 \
            or sparse_indices.shape[:2] != (tokens, 1):
        raise NPUOpError(f"{op}: sparse_indices {sparse_indices.dtype} "
                         f"{tuple(sparse_indices.shape)} must be int32 [T, 1, K]")
    bs = key.shape[1]
    if not _is_power_of_two(sparse_block_size) or sparse_block_size > 128 \
            or bs % sparse_block_size:
        raise NPUOpError(f"{op}: sparse_block_size {sparse_block_size} must be a power of "
                         f"two up to 128 dividing block_size {bs}")
    out = torch.zeros(tokens, heads, dim, dtype=torch.float32, device=query.device)
    for b, (t0, s1, s2) in enumerate(_requests(actual_seq_lengths_query,
                                               actual_seq_lengths_kv, tokens, op)):
        if s1 == 0:
            continue
        kv = _gather(key, block_table[b], s2).float()                    # [S2, 512]
        val = _gather(value, block_table[b], s2).float()
        kr = _gather(key_rope, block_table[b], s2).float()               # [S2, 64]
        limits = _visible(s1, s2, sparse_mode).tolist()
        for r in range(s1):
            t = t0 + r
            keys = _selected(sparse_indices[t, 0].tolist(), limits[r], sparse_block_size)
            if not keys:
                continue
            j = torch.tensor(keys, device=query.device)
            scores = (query[t].float() @ kv[j].T + query_rope[t].float() @ kr[j].T)
            out[t] = torch.softmax(scores * scale_value, dim=-1) @ val[j]
    return out.to(query.dtype), query.new_empty(0), query.new_empty(0)


def _selected(row: list[int], limit: int, block: int) -> list[int]:
    """Key positions a row attends: its entries up to the first -1, at most
    ceil(limit / block) of them scanned (the kernel's validCount), each entry covering
    `block` positions, those at or past `limit` skipped."""
    keys = []
    for idx in row[: -(-limit // block)]:
        if idx < 0:
            break
        keys.extend(p for p in range(idx * block, idx * block + block) if p < limit)
    return keys
