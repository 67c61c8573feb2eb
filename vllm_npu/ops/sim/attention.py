"""Simulated attention ops: `npu_fused_infer_attention_score` (TND, paged KV) and ATB
`_npu_paged_attention`, plain PyTorch with the device ops' argument conventions.

Paged KV as the device reads it (one layer, K shown; V alike):

    key_cache [num_blocks, block_size, Hkv*D]     block_table [B, max_blocks] int32
    request b, kv position p  ->  key_cache[block_table[b, p // block_size], p % block_size]

TND query: all requests' tokens concatenated, [T, N, D]; `actual_seq_lengths` holds the
cumulative query ends (host list), `actual_seq_lengths_kv` each request's kv length.
sparse_mode 3 (right-down causal): query row i of a request with q and kv tokens sees kv
positions j <= kv - q + i.  sparse_mode 4 (band): additionally j >= kv - q + i - pre_tokens.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from vllm_npu.ops.sim import fia_shapes, paged_decode
from vllm_npu.ops.sim.attend import attend_padded, gather_paged
from vllm_npu.ops.sim.checks import (
    NPUOpError,
    check_contiguous,
    check_dim,
    check_dtype,
    check_heads,
)

_MASK_SIDE = 2048  # sparse modes 2-4 take the compressed 2048x2048 triangular mask
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
_INT_MAX = 2147483647
_PAGED_BLOCK_SIZES = range(128, 513, 128)
# MLA decode through FIA: <= 16 query tokens per request (vllm-ascend attention/mla_v1.py,
# "npu_fused_infer_attention_score TND layout's limit of 16").
_MLA_MAX_QUERY = 16


def _host_ints(op: str, name: str, values) -> list[int]:
    """Host-side int arrays must be Python sequences, as for the device op."""
    if isinstance(values, torch.Tensor) or not isinstance(values, Sequence):
        raise NPUOpError(f"{op}: {name} must be a host list of ints, got {type(values).__name__}")
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise NPUOpError(f"{op}: {name} has negative entries: {out}")
    return out


def _check_mask(op: str, sparse_mode: int, atten_mask: torch.Tensor | None) -> None:
    if sparse_mode == 0:
        if atten_mask is not None:
            raise NotImplementedError(
                f"{op}: the simulator supports sparse_mode=0 only without atten_mask")
        return
    if sparse_mode not in (2, 3, 4):
        raise NPUOpError(f"{op}: sparse_mode={sparse_mode}; supported: 0, 1, 2, 3, 4 "
                         "(the simulator implements 0, 3, 4)")
    if sparse_mode == 2:
        raise NotImplementedError(f"{op}: the simulator does not implement sparse_mode=2")
    if atten_mask is None or tuple(atten_mask.shape[-2:]) != (_MASK_SIDE, _MASK_SIDE):
        shape = None if atten_mask is None else tuple(atten_mask.shape)
        raise NPUOpError(f"{op}: sparse_mode={sparse_mode} needs the compressed "
                         f"({_MASK_SIDE}, {_MASK_SIDE}) atten_mask, got {shape}")
    if atten_mask.dtype not in _MASK_DTYPES:
        raise NPUOpError(f"{op}: atten_mask dtype {atten_mask.dtype}; supported: {_MASK_DTYPES}")
    _check_mask_contents(op, sparse_mode, atten_mask)


# (data_ptr, version) -> the checked mask's storage, weakly: an entry whose storage was
# freed or replaced no longer vouches for whatever now lies at that address
_CHECKED_MASKS: dict[tuple, weakref.ref] = {}


def _check_mask_contents(op: str, sparse_mode: int, atten_mask: torch.Tensor) -> None:
    """Sparse modes 2-4 take the *compressed* mask, not a mask of the batch: the fixed
    2048x2048 matrix with 1 (masked) strictly above the diagonal, 0 elsewhere; the kernel
    derives each request's causal/band mask from it and its sequence lengths (torch_npu
    `npu_fused_infer_attention_score` / `npu_fusion_attention` docs: "传入的atten_mask为优化后
    的压缩下三角矩阵(2048*2048)"). Any other contents give wrong attention on a device
    while the simulator would still apply the right mask: refused."""
    # (inference tensors keep no version counter: those are checked once per address)
    version = None if atten_mask.is_inference() else atten_mask._version
    key = (atten_mask.data_ptr(), version)
    storage = atten_mask.untyped_storage()
    checked = _CHECKED_MASKS.get(key)
    if checked is not None and checked() is storage:
        return
    square = atten_mask.reshape(-1, _MASK_SIDE, _MASK_SIDE)
    want = torch.ones(_MASK_SIDE, _MASK_SIDE, dtype=torch.bool).triu_(1)
    if not all(torch.equal(m.bool(), want) for m in square):
        raise NPUOpError(f"{op}: sparse_mode={sparse_mode} needs the compressed causal "
                         f"mask (True strictly above the diagonal of a {_MASK_SIDE}x"
                         f"{_MASK_SIDE} matrix); got a mask with other contents")
    if len(_CHECKED_MASKS) > 64:
        _CHECKED_MASKS.clear()
    _CHECKED_MASKS[key] = weakref.ref(storage)


def npu_fused_infer_attention_score(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1, scale: float = 1.0,
    pre_tokens: int = _INT_MAX, next_tokens: int = _INT_MAX,
    input_layout: str = "BSH", num_key_value_heads: int = 0, sparse_mode: int = 0,
    inner_precise: int = 0, block_size: int = 0, softmax_lse_flag: bool = False,
    query_rope: torch.Tensor | None = None, key_rope: torch.Tensor | None = None,
    **unsupported,
):
    """`query_rope`/`key_rope` (the MLA form, torch_npu API reference for
    npu_fused_infer_attention_score, hiascend ptaoplist_001232): scores add
    query_rope . key_rope to query . key; values are `value` alone."""
    op = "npu_fused_infer_attention_score"
    used = {k: v for k, v in unsupported.items() if v is not None}
    if used:
        raise NotImplementedError(f"{op}: the simulator does not implement {sorted(used)}")
    if input_layout != "TND":
        raise NotImplementedError(f"{op}: the simulator implements input_layout='TND' only, "
                                  f"got {input_layout!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_dtype(op, name, t)
    if not (query.dtype == key.dtype == value.dtype):
        raise NPUOpError(f"{op}: query/key/value dtypes differ: "
                         f"{query.dtype}, {key.dtype}, {value.dtype}")
    check_contiguous(op, query=query, key=key, value=value)
    check_dim(op, "query", query, 3)
    T, N, D = query.shape
    if N != num_heads:
        raise NPUOpError(f"{op}: num_heads={num_heads} but query has {N} heads")
    if N > 256 or D > 512:
        raise NPUOpError(f"{op}: N={N} (max 256) / D={D} (max 512) out of range")
    if query.dtype != torch.float32 and D % 16:
        raise NPUOpError(f"{op}: head dim {D} must be 16-aligned for {query.dtype}")
    hkv = num_key_value_heads or num_heads
    check_heads(op, num_heads, hkv)
    _check_mask(op, sparse_mode, atten_mask)
    if (query_rope is None) != (key_rope is None):
        raise NPUOpError(f"{op}: query_rope and key_rope come together")
    if query_rope is not None:
        check_contiguous(op, query_rope=query_rope, key_rope=key_rope)
        if query_rope.dtype != query.dtype or key_rope.dtype != query.dtype:
            raise NPUOpError(f"{op}: query_rope/key_rope dtypes must be the query's "
                             f"{query.dtype}")
        if query_rope.shape[:2] != query.shape[:2] or block_table is None \
                or key_rope.shape[:2] != key.shape[:2] \
                or key_rope.shape[2] != hkv * query_rope.shape[2]:
            raise NPUOpError(f"{op}: query_rope [T, N, R] and paged key_rope [num_blocks, "
                             f"block_size, Hkv*R] must match query {tuple(query.shape)} / "
                             f"key {tuple(key.shape)}; got {tuple(query_rope.shape)} / "
                             f"{tuple(key_rope.shape)}")
        fia_shapes.check_mla_form(op, N, hkv, D, query_rope.shape[2])
    elif block_table is None:
        fia_shapes.check_dense_tnd(op, query.dtype, N, hkv, D, value.shape[-1])
    if actual_seq_lengths is None or actual_seq_lengths_kv is None:
        raise NPUOpError(f"{op}: TND needs actual_seq_lengths and actual_seq_lengths_kv")
    q_ends = _host_ints(op, "actual_seq_lengths", actual_seq_lengths)
    kv_arg = _host_ints(op, "actual_seq_lengths_kv", actual_seq_lengths_kv)
    if any(b < a for a, b in zip(q_ends, q_ends[1:])):
        raise NPUOpError(f"{op}: actual_seq_lengths must be non-decreasing cumulative ends, "
                         f"got {q_ends}")
    # CANN tiling: "queryT != last element of actualSequenceLengthQ" (vllm-ascend pads the
    # ends to T: attention/attention_v1.py, worker/v2/spec_decode/*/speculator.py).
    if (q_ends[-1] if q_ends else 0) != T:
        raise NPUOpError(f"{op}: in TND layout the last actual_seq_lengths entry must equal "
                         f"the query's T={T}; got {q_ends}")
    B = len(q_ends)
    if len(kv_arg) != B:
        raise NPUOpError(f"{op}: {len(kv_arg)} kv lengths for {B} batches")
    q_starts = [0] + q_ends[:-1]
    q_lens = [e - s for s, e in zip(q_starts, q_ends)]

    if block_table is not None:
        check_dim(op, "key", key, 3)
        if block_size not in _PAGED_BLOCK_SIZES or key.shape[1] != block_size:
            raise NPUOpError(f"{op}: page attention needs block_size in 128..512, a multiple "
                             f"of 128, equal to key.shape[1]; got block_size={block_size}, "
                             f"key {tuple(key.shape)}")
        if key.shape != value.shape or key.shape[2] != hkv * D:
            raise NPUOpError(f"{op}: paged key/value must be [num_blocks, block_size, "
                             f"{hkv}*{D}], got {tuple(key.shape)} / {tuple(value.shape)}")
        if block_table.dtype != torch.int32 or block_table.dim() != 2 \
                or block_table.shape[0] != B:
            raise NPUOpError(f"{op}: block_table must be int32 [B={B}, max_blocks], got "
                             f"{block_table.dtype} {tuple(block_table.shape)}")
        kv_lens = kv_arg
        if max(kv_lens, default=0) > block_table.shape[1] * block_size:
            raise NPUOpError(f"{op}: kv length {max(kv_lens)} exceeds the block table's "
                             f"{block_table.shape[1]} blocks of {block_size}")
        d_v = value.shape[-1] // hkv

        def gather_keys(rows: torch.Tensor, length: int) -> torch.Tensor:
            keys = gather_paged(key, rows, hkv, length)
            if key_rope is None:
                return keys
            return torch.cat((keys, gather_paged(key_rope, rows, hkv, length)), dim=-1)

        def get_kv(rows: list[int], length: int):
            table = block_table[rows]
            return gather_keys(table, length), gather_paged(value, table, hkv, length)
    else:
        # Unpaged TND: key/value [T_kv, Hkv, D] with cumulative kv ends.
        check_dim(op, "key", key, 3)
        if any(b < a for a, b in zip(kv_arg, kv_arg[1:])) or \
                (kv_arg and kv_arg[-1] > key.shape[0]):
            raise NPUOpError(f"{op}: unpaged actual_seq_lengths_kv must be cumulative ends "
                             f"<= {key.shape[0]}, got {kv_arg}")
        kv_starts = [0] + kv_arg[:-1]
        kv_lens = [e - s for s, e in zip(kv_starts, kv_arg)]
        d_v = value.shape[-1]

        def get_kv(rows: list[int], length: int):
            if length == 0:
                return key[:0].expand(len(rows), 0, *key.shape[1:]), \
                    value[:0].expand(len(rows), 0, *value.shape[1:])
            idx = _padded_index([kv_starts[b] for b in rows], [kv_lens[b] for b in rows],
                                length, key.shape[0])
            return key[idx], value[idx]

    if query_rope is not None and max(q_lens, default=0) > _MLA_MAX_QUERY:
        raise NPUOpError(f"{op}: the MLA form (query_rope) takes at most {_MLA_MAX_QUERY} "
                         f"query tokens per request, got {max(q_lens)}")
    if any(q > kv for q, kv in zip(q_lens, kv_lens)) and sparse_mode in (3, 4):
        raise NPUOpError(f"{op}: right-down causal needs q_len <= kv_len per batch, got "
                         f"q {q_lens} kv {kv_lens}")
    causal = sparse_mode in (3, 4)
    pre = pre_tokens if sparse_mode == 4 else _INT_MAX
    nxt = next_tokens if sparse_mode == 4 else 0
    ql = torch.tensor(q_lens)
    kl = torch.tensor(kv_lens)
    # A paged cache is read in place, every query row against its own causal / band
    # limits (no gathered copy, no padded batch); without the native kernel, single-token
    # rows (decodes) run as one padded batch and the others in groups of similar lengths,
    # so a long prefill never pads every decode row.
    if block_table is not None and nxt >= 0 and paged_decode.supports(
            *((key, value) if key_rope is None else (key, value, key_rope))):
        return _fia_paged_in_place(query, key, value, hkv, block_table, ql, kl, scale,
                                   causal, pre, nxt, softmax_lse_flag, query_rope, key_rope)
    if query_rope is not None:  # q.k + q_rope.k_rope == [q | q_rope] . [k | k_rope]
        query = torch.cat((query, query_rope), dim=-1)
    out = torch.zeros(T, N, d_v, dtype=query.dtype)
    lse = torch.zeros(T, N, 1, dtype=torch.float32)
    singles = [b for b in range(B) if q_lens[b] == 1] if block_table is not None else []
    if singles:
        rows = torch.tensor(singles)
        k = gather_keys(block_table[rows], max(kv_lens[b] for b in singles))
        v = gather_paged(value, block_table[rows], hkv, max(kv_lens[b] for b in singles))
        tok = torch.tensor([q_starts[b] for b in singles])
        o, lse_rows = attend_padded(query[tok].unsqueeze(1), k, v, ql[rows], kl[rows], scale,
                                    causal, pre, nxt, softmax_lse_flag)
        out[tok] = o[:, 0]
        if softmax_lse_flag:
            lse[tok] = lse_rows[:, 0].unsqueeze(-1)
    done = set(singles)
    rest = [b for b in range(B) if q_lens[b] > 0 and b not in done]
    for rows in row_groups(rest, q_lens, kv_lens):
        width = max(q_lens[b] for b in rows)
        tok = _padded_index([q_starts[b] for b in rows], [q_lens[b] for b in rows], width, T)
        valid = torch.arange(width).view(1, -1) < ql[rows].view(-1, 1)
        k, v = get_kv(rows, max(kv_lens[b] for b in rows))
        o, lse_rows = attend_padded(query[tok], k, v, ql[rows], kl[rows], scale, causal, pre,
                                    nxt, softmax_lse_flag)
        out[tok[valid]] = o[valid]
        if softmax_lse_flag:
            lse[tok[valid]] = lse_rows[valid].unsqueeze(-1)
    return out, (lse if softmax_lse_flag else torch.zeros(1))


def _fia_paged_in_place(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, hkv: int,
                        block_table: torch.Tensor, q_lens: torch.Tensor, kv_lens: torch.Tensor,
                        scale: float, causal: bool, pre: int, nxt: int, want_lse: bool,
                        q_rope: torch.Tensor | None, key_rope: torch.Tensor | None):
    """FIA over a paged cache with the native kernel: query token i of request b (q new
    tokens, kv in all) sees keys [first, lens) of b's table row: with right-down causal
    masking lens = min(kv, kv - q + i + 1 + next_tokens) and, for a band, first =
    kv - q + i - pre_tokens (at least 0); without masking all kv keys."""
    T = q.shape[0]
    req = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens, output_size=T)
    kv = kv_lens[req]
    if causal:
        ends = torch.cumsum(q_lens, 0)
        diag = kv - q_lens[req] + torch.arange(T) - (ends - q_lens)[req]
        lens = torch.minimum(kv, diag + nxt + 1)
        first = (diag - pre).clamp_(min=0) if pre < _INT_MAX else torch.zeros_like(kv)
    else:
        lens, first = kv, torch.zeros_like(kv)
    out, lse = paged_decode.paged_rows(q, key, value, hkv, block_table, first, lens, scale,
                                       row_of=req, query_rope=q_rope, key_rope=key_rope,
                                       want_lse=want_lse)
    return out, (lse.unsqueeze(-1) if want_lse else torch.zeros(1))


def _padded_index(starts: list[int], lengths: list[int], width: int,
                  limit: int) -> torch.Tensor:
    """[G, width] row indices: start + i, repeating a row's last index past its length
    (those positions are masked) and kept below `limit`."""
    i = torch.arange(width).view(1, -1)
    last = (torch.tensor(lengths) - 1).clamp(min=0).view(-1, 1)
    return (torch.tensor(starts).view(-1, 1) + torch.minimum(i, last)).clamp(max=limit - 1)


# A padded group holds at most this many query x key positions, and at most 1.25 times
# the positions its rows need: batches of equal prompts run as one call, a long one alone.
_GROUP_POSITIONS = 1 << 24
_GROUP_PADDING = 1.25


def row_groups(rows: list[int], q_lens: list[int], kv_lens: list[int]) -> list[list[int]]:
    """`rows` split into batches for padded attention (longest kv first)."""
    groups: list[list[int]] = []
    need = width = 0
    for b in sorted(rows, key=lambda b: (kv_lens[b], q_lens[b]), reverse=True):
        cost = q_lens[b] * max(kv_lens[b], 1)
        if groups:
            cur = groups[-1]
            padded = (len(cur) + 1) * max(width, q_lens[b]) * max(kv_lens[cur[0]], 1)
            if padded <= min(_GROUP_PADDING * (need + cost), _GROUP_POSITIONS):
                cur.append(b)
                need, width = need + cost, max(width, q_lens[b])
                continue
        groups.append([b])
        need, width = cost, q_lens[b]
    return groups


# Workspaces. The device ops size theirs from their tiling; the simulator's size model
# keeps the property callers depend on: FIA's "max" workspace depends on shapes only,
# ATB paged attention's grows with the longest context (vllm-ascend captures with a fixed
# long seq_len for that reason: model_runner_v1.py, SEQ_LEN_WITH_MAX_PA_WORKSPACE).
_WORKSPACE_BASE = 4096
_WORKSPACE_UNIT = 64


def _check_workspace(op: str, workspace: torch.Tensor | None, need: int) -> None:
    if workspace is None:
        return  # eager call: the op allocates its own
    have = workspace.numel() * workspace.element_size()
    if have < need:
        raise NPUOpError(f"{op}: workspace of {have} bytes, the call needs {need} (size it "
                         "with the op's get-workspace function for the largest batch the "
                         "task will be updated with)")


def _fia_workspace_bytes(query: torch.Tensor, num_heads: int) -> int:
    return _WORKSPACE_BASE + _WORKSPACE_UNIT * query.shape[0] * num_heads


def _npu_fused_infer_attention_score_get_max_workspace(query: torch.Tensor, key: torch.Tensor,
                                                       value: torch.Tensor, *,
                                                       num_heads: int = 1,
                                                       **kwargs) -> torch.Tensor:
    """The workspace an FIA call of these shapes needs for any sequence lengths."""
    return torch.empty(_fia_workspace_bytes(query, num_heads), dtype=torch.uint8)


def _paged_workspace_bytes(query: torch.Tensor, key_cache: torch.Tensor, longest: int) -> int:
    blocks = -(-longest // key_cache.shape[1])
    return _WORKSPACE_BASE + _WORKSPACE_UNIT * query.shape[0] * query.shape[1] * blocks


def _npu_paged_attention_get_workspace(query: torch.Tensor, key_cache: torch.Tensor,
                                       value_cache: torch.Tensor, num_kv_heads: int,
                                       num_heads: int, scale_value: float,
                                       block_table: torch.Tensor, context_lens: torch.Tensor,
                                       out: torch.Tensor) -> torch.Tensor:
    """The workspace `_npu_paged_attention` needs for these context lengths (longer
    contexts need more)."""
    longest = int(context_lens.max()) if context_lens.numel() else 0
    return torch.empty(_paged_workspace_bytes(query, key_cache, longest), dtype=torch.uint8)


def _check_paged_attention(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, num_kv_heads: int, num_heads: int,
                           block_table: torch.Tensor, context_lens: torch.Tensor,
                           out: torch.Tensor, workspace: torch.Tensor | None) -> int:
    """`_npu_paged_attention`'s checks (ATB's, when the op is launched); returns the
    longest context."""
    op = "_npu_paged_attention"
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_dtype(op, name, t)
    check_dim(op, "query", query, 3)
    check_dim(op, "key_cache", key_cache, 4)
    check_contiguous(op, query=query, key_cache=key_cache, value_cache=value_cache)
    check_heads(op, num_heads, num_kv_heads)
    B, N, D = query.shape
    if N != num_heads or key_cache.shape[2:] != (num_kv_heads, D) \
            or value_cache.shape != key_cache.shape:
        raise NPUOpError(f"{op}: query {tuple(query.shape)}, key_cache {tuple(key_cache.shape)} "
                         f"do not match num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    if block_table.dtype != torch.int32 or block_table.shape[0] != B:
        raise NPUOpError(f"{op}: block_table must be int32 with {B} rows, got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.device.type != "cpu" \
            or context_lens.shape != (B,):
        raise NPUOpError(f"{op}: context_lens must be a host int32 tensor of shape ({B},)")
    if out.shape != query.shape or out.dtype != query.dtype:
        raise NPUOpError(f"{op}: out must match query {tuple(query.shape)} {query.dtype}")
    _check_paged_limits(op, key_cache.shape[1], D)
    return _check_paged_values(query, key_cache, block_table, context_lens, workspace)


def _check_paged_values(query: torch.Tensor, key_cache: torch.Tensor,
                        block_table: torch.Tensor, context_lens: torch.Tensor,
                        workspace: torch.Tensor | None) -> int:
    """The checks of `_check_paged_attention` that read the block ids and context lengths
    (all a re-issue on the same memory can change); returns the longest context."""
    op, bs = "_npu_paged_attention", key_cache.shape[1]
    _check_block_ids(op, block_table, key_cache.shape[0])
    max_len = int(context_lens.max()) if context_lens.numel() else 0
    if max_len > block_table.shape[1] * bs:
        raise NPUOpError(f"{op}: context length {max_len} exceeds the block table "
                         f"({block_table.shape[1]} blocks of {bs}; ATB: "
                         "max_num_blocks_per_seq >= ceil(max(contextLens) / block_size))")
    _check_workspace(op, workspace, _paged_workspace_bytes(query, key_cache, max_len))
    return max_len


def _npu_paged_attention(query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, num_kv_heads: int, num_heads: int,
                         scale_value: float, block_table: torch.Tensor,
                         context_lens: torch.Tensor, out: torch.Tensor,
                         workspace: torch.Tensor | None = None) -> None:
    """Decode attention (one query token per request), written into `out` [B, N, D].

    key_cache/value_cache [num_blocks, block_size, Hkv, D]; context_lens int32 on the host.
    """
    max_len = _check_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads,
                                     block_table, context_lens, out, workspace)
    if paged_decode.supports(key_cache, value_cache):
        result, _ = paged_decode.paged_decode(query, key_cache, value_cache, num_kv_heads,
                                              block_table, context_lens, scale_value,
                                              out=out, want_lse=False)
        if result is not out:  # not float32: the kernel wrote a float32 copy
            out.copy_(result)
        return
    B, bs = query.shape[0], key_cache.shape[1]
    flat_k = key_cache.view(key_cache.shape[0], bs, -1)
    flat_v = value_cache.view(value_cache.shape[0], bs, -1)
    k = gather_paged(flat_k, block_table, num_kv_heads, max_len)
    v = gather_paged(flat_v, block_table, num_kv_heads, max_len)
    ones = torch.ones(B, dtype=torch.long)
    o, _ = attend_padded(query.unsqueeze(1), k, v, ones, context_lens.long(), scale_value,
                         True, _INT_MAX, 0)
    out.copy_(o[:, 0])


def paged_attention_launch(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, num_kv_heads: int, num_heads: int,
                           scale_value: float, block_table: torch.Tensor,
                           context_lens: torch.Tensor, out: torch.Tensor,
                           workspace: torch.Tensor | None = None):
    """`_npu_paged_attention` issued as a graph task: its checks now, then the kernel's
    launch (graph.graph_op's `launcher`; None: the replay runs the op)."""
    _check_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads,
                           block_table, context_lens, out, workspace)
    if not paged_decode.supports(key_cache, value_cache):
        return None
    return paged_decode.decode_launch(query, key_cache, value_cache, num_kv_heads,
                                      block_table, context_lens, scale_value, out)


def paged_attention_relaunch(launch: tuple, held: dict, call: dict):
    """`_npu_paged_attention` re-issued as its task's call was, on the same memory
    (graph.graph_op's `relaunch`): the checks that read the new block ids and lengths,
    then the commit that copies the lengths into the task and its kernel's launch."""
    lens = call["context_lens"]
    _check_paged_values(call["query"], call["key_cache"], call["block_table"], lens,
                        call["workspace"])
    (kernel,) = launch

    def commit() -> None:
        with torch.inference_mode():  # the copies may be inference tensors (made in one)
            held["context_lens"].copy_(lens)
            paged_decode.refresh_lens(kernel, lens)

    return commit


_PA_HEAD_MAX = 576         # K/V head size (0, 576] ...
_PA_WIDE_HEAD = 256        # ... and above 256, block_size <= 128
_PA_WIDE_HEAD_BLOCK = 128


def _check_paged_limits(op: str, block_size: int, head_size: int) -> None:
    """ATB PagedAttentionOperation's documented limits (CANN ascendtb "约束说明",
    ascendtb_01_0198): block_size % 16 == 0; head_size in (0, 576] with block_size <= 128
    when it exceeds 256 (the (0, 256], block_size * head_size <= 128*128 rule applies only
    to the compression / parallel-decoding / quantized modes, which the plugin does not
    use); every blockTables element in [0, num_blocks) (`_check_block_ids`)."""
    if block_size % 16:
        raise NPUOpError(f"{op}: block_size {block_size} must be a multiple of 16")
    if not 0 < head_size <= _PA_HEAD_MAX or \
            (head_size > _PA_WIDE_HEAD and block_size > _PA_WIDE_HEAD_BLOCK):
        raise NPUOpError(f"{op}: head size {head_size} with block_size {block_size}: needs "
                         f"head size in (0, {_PA_HEAD_MAX}] and block_size <= "
                         f"{_PA_WIDE_HEAD_BLOCK} above {_PA_WIDE_HEAD}")


def _check_block_ids(op: str, block_table: torch.Tensor, num_blocks: int) -> None:
    if block_table.numel():
        lowest, highest = (int(v) for v in torch.aminmax(block_table))
        if lowest < 0 or highest >= num_blocks:
            raise NPUOpError(f"{op}: block_table elements must lie in [0, {num_blocks}), "
                             f"got [{lowest}, {highest}]")


def npu_fused_infer_attention_score_out(query: torch.Tensor, key: torch.Tensor,
                                        value: torch.Tensor, *, out: list[torch.Tensor],
                                        workspace: torch.Tensor | None = None,
                                        **kwargs) -> None:
    """The `.out` variant (what graph capture records): results go into out=[attn, lse]."""
    attn, lse = npu_fused_infer_attention_score(query, key, value, **kwargs)
    write_fia_out("npu_fused_infer_attention_score.out", query, kwargs, attn, lse, out,
                  workspace)


def write_fia_out(op: str, query: torch.Tensor, kwargs: dict, attn: torch.Tensor,
                  lse: torch.Tensor, out: list[torch.Tensor],
                  workspace: torch.Tensor | None) -> None:
    """An `.out` variant's checks (v1 argument names in `kwargs`), then its writes."""
    _check_workspace(op, workspace, _fia_workspace_bytes(query, kwargs.get("num_heads", 1)))
    if out[0].shape != attn.shape or out[0].dtype != attn.dtype:
        raise NPUOpError(f"{op}: out[0] must be {tuple(attn.shape)} {attn.dtype}, got "
                         f"{tuple(out[0].shape)} {out[0].dtype}")
    out[0].copy_(attn)
    if kwargs.get("softmax_lse_flag"):
        if out[1].shape != lse.shape or out[1].dtype != lse.dtype:
            raise NPUOpError(f"{op}: out[1] (softmax_lse) must be {tuple(lse.shape)} "
                             f"{lse.dtype}, got {tuple(out[1].shape)} {out[1].dtype}")
        out[1].copy_(lse)
