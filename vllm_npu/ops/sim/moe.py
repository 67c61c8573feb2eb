"""Simulated torch_npu MoE ops: gating top-k, init-routing v2, grouped matmul, token unpermute.

Contracts (arguments, limits, index formats) follow torch_npu 2.14's `_op_plugin_docs.py`
(entries npu_moe_gating_top_k, npu_moe_init_routing_v2, npu_grouped_matmul,
npu_moe_token_unpermute), its schemas in `npu_native_functions_by_codegen.yaml` and shape
functions in `op_plugin/meta/_meta_registrations.py`, and the reference formulas in op-plugin's
`docs/zh/custom_APIs/torch_npu/torch_npu-<op>.md`.

Rows the device leaves undefined (past the valid count of init_routing_v2 / grouped matmul)
are NaN here: a caller that reads them un-masked fails in CI as it would read garbage on
a device. The grouped matmul is simulated unquantized and in its per-token int8 form (W8A8
dynamic MoE experts); other quantized forms are refused.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_dim, check_dtype

GATING_MAX_EXPERTS = 2048        # npu_moe_gating_top_k: x.shape[-1] <= 2048
INIT_ROUTING_MAX_EXPERTS = 10240  # npu_moe_init_routing_v2: expert_num in (0, 10240]
GMM_MAX_GROUPS = 1024            # npu_grouped_matmul: group_list holds at most 1024 groups
GMM_MAX_LAST_DIM = 65536         # npu_grouped_matmul: last dim of x and weight < 65536
UNPERMUTE_MAX_TOPK = 512         # npu_moe_token_unpermute: topK <= 512
_UNDEFINED = float("nan")


def _align32(n: int) -> int:
    return (n + 31) // 32 * 32


def npu_moe_gating_top_k(x: torch.Tensor, k: int, *, bias: torch.Tensor | None = None,
                         input_ids=None, tid2eid=None, k_group: int = 1, group_count: int = 1,
                         group_select_mode: int = 0, renorm: int = 0, norm_type: int = 0,
                         out_flag: bool = False, routed_scaling_factor: float = 1.0,
                         eps: float = 1e-20):
    """(y [T,k] x.dtype, expert_idx [T,k] int32, norm_out [T,E] float32).

    s = softmax(x) (norm_type 0) or sigmoid(x) (1); `bias` only steers selection; groups
    score by their max (group_select_mode 0) or the sum of their top two (1), the best
    `k_group` groups stay; y = s at the picks, divided by its sum for sigmoid only, times
    `routed_scaling_factor`. Softmax weights are never renormalised (renorm must be 0)."""
    op = "npu_moe_gating_top_k"
    check_dtype(op, "x", x)
    check_dim(op, "x", x, 2)
    if input_ids is not None or tid2eid is not None:
        raise NPUOpError(f"{op}: hash routing (input_ids/tid2eid) is not simulated")
    num_tokens, experts = x.shape
    if experts > GATING_MAX_EXPERTS:
        raise NPUOpError(f"{op}: {experts} experts; the op takes at most {GATING_MAX_EXPERTS}")
    if renorm != 0:
        raise NPUOpError(f"{op}: renorm={renorm}; torch_npu supports only 0 (norm, then top-k)")
    if norm_type not in (0, 1):
        raise NPUOpError(f"{op}: norm_type={norm_type}; valid: 0 (softmax), 1 (sigmoid)")
    if group_select_mode not in (0, 1):
        raise NPUOpError(f"{op}: group_select_mode={group_select_mode}; valid: 0 (max), "
                         "1 (sum of top 2)")
    per_group = experts // group_count if group_count > 0 else 0
    if (group_count <= 0 or experts % group_count or per_group <= 2
            or _align32(per_group) * group_count > GATING_MAX_EXPERTS):
        raise NPUOpError(f"{op}: group_count={group_count} for {experts} experts; it must "
                         "divide the experts into groups of more than 2, with "
                         f"align32(group size) * group_count <= {GATING_MAX_EXPERTS}")
    if not 1 <= k_group <= group_count:
        raise NPUOpError(f"{op}: k_group={k_group}; valid: 1..group_count={group_count}")
    if not 1 <= k <= per_group * k_group:
        raise NPUOpError(f"{op}: k={k}; valid: 1..{per_group * k_group} (experts in the "
                         f"{k_group} selected group(s))")
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != experts or bias.dtype != x.dtype:
            raise NPUOpError(f"{op}: bias must be 1-D [{experts}] of dtype {x.dtype}, got "
                             f"{tuple(bias.shape)} {bias.dtype}")
    scores = x.float().softmax(-1) if norm_type == 0 else x.float().sigmoid()
    choice = scores + bias.float() if bias is not None else scores
    if group_count > 1:
        grouped = choice.view(num_tokens, group_count, per_group)
        group_score = (grouped.max(-1).values if group_select_mode == 0
                       else grouped.topk(2, dim=-1).values.sum(-1))
        keep = group_score.argsort(dim=-1, descending=True, stable=True)[:, :k_group]
        kept = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~kept.repeat_interleave(per_group, 1), float("-inf"))
    idx = choice.argsort(dim=-1, descending=True, stable=True)[:, :k]
    y = scores.gather(1, idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), scores


def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale=None,
                            offset=None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0,
                            expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range=(), row_idx_type: int = 0, x_dtype=None):
    """(expanded_x, expanded_row_idx [T*K] int32, expert_tokens_count int64, expanded_scale).

    Pairs f = t*K + k are stably sorted by expert id (expert-major, tokens ascending);
    experts outside `active_expert_range` [start, end) sort last and are dropped:

        expanded_x[i]        = x[order[i] // K]          rows past the in-range count: NaN
        row_idx_type 0:      expanded_row_idx[f] = i     (source -> destination; -1 = dropped)
        row_idx_type 1:      expanded_row_idx[i] = f     (destination -> source)
        counts[e - start]    = pairs routed to expert e  (expert_tokens_num_type 1)
    """
    op = "npu_moe_init_routing_v2"
    check_dtype(op, "x", x)
    check_dim(op, "x", x, 2)
    check_dim(op, "expert_idx", expert_idx, 2)
    if expert_idx.dtype != torch.int32 or expert_idx.shape[0] != x.shape[0]:
        raise NPUOpError(f"{op}: expert_idx must be int32 [{x.shape[0]}, K], got "
                         f"{expert_idx.dtype} {tuple(expert_idx.shape)}")
    if quant_mode != -1 or offset is not None:
        raise NPUOpError(f"{op}: quant_mode={quant_mode}; quantized routing is not simulated "
                         "(valid here: -1)")
    if drop_pad_mode != 0:
        raise NPUOpError(f"{op}: drop_pad_mode={drop_pad_mode}; torch_npu 2.14 supports 0")
    if not expert_tokens_num_flag:
        raise NPUOpError(f"{op}: expert_tokens_num_flag must be True (torch_npu 2.14)")
    if expert_tokens_num_type != 1:
        raise NPUOpError(f"{op}: expert_tokens_num_type={expert_tokens_num_type}; simulated: "
                         "1 (counts); the device also takes 2 (key-value)")
    if not 0 < expert_num <= INIT_ROUTING_MAX_EXPERTS:
        raise NPUOpError(f"{op}: expert_num={expert_num}; valid: 1..{INIT_ROUTING_MAX_EXPERTS}")
    start, end = tuple(active_expert_range) or (0, expert_num)
    if not 0 <= start < end <= expert_num:
        raise NPUOpError(f"{op}: active_expert_range={[start, end]} must be increasing "
                         f"within [0, expert_num={expert_num}]")
    if row_idx_type not in (0, 1):
        raise NPUOpError(f"{op}: row_idx_type={row_idx_type}; valid: 0 (gather), 1 (scatter)")
    if active_num < -1:
        raise NPUOpError(f"{op}: active_num={active_num}; valid: >= -1")
    top_k = expert_idx.shape[1]
    pairs = expert_idx.numel()
    flat = expert_idx.reshape(-1).long()
    if pairs and (int(flat.min()) < 0 or int(flat.max()) >= expert_num):
        raise NPUOpError(f"{op}: expert ids must lie in [0, expert_num={expert_num})")
    in_range = (flat >= start) & (flat < end)
    order = torch.where(in_range, flat, expert_num).argsort(stable=True)
    valid = int(in_range.sum())
    rows = pairs if active_num <= 0 else min(active_num, pairs)
    expanded_x = x[order[:rows] // top_k]
    expanded_x[valid:] = _UNDEFINED
    position = torch.empty(pairs, dtype=torch.long)
    position[order] = torch.arange(pairs)
    if row_idx_type == 0:
        row_idx = torch.where(in_range, position, -1)
    else:
        row_idx = order.clone()
        row_idx[valid:] = -(1 << 31)  # uninitialised on the device
    counts = torch.zeros(end - start, dtype=torch.int64)
    counts.scatter_add_(0, (flat[in_range] - start), torch.ones(valid, dtype=torch.int64))
    expanded_scale = (scale.float()[order[:rows] // top_k] if scale is not None
                      else torch.empty(0, dtype=torch.float32))
    return expanded_x, row_idx.to(torch.int32), counts, expanded_scale


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None,
                       activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item: int = 0, group_type=None,
                       group_list_type: int = 0, act_type: int = 0, tuning_config=None,
                       output_dtype=None, x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """The MoE form ("single x, single weight, single y", group_type 0): x [M, K] sorted by
    group, weight [E, K, N], group_list int64 [E] (0: cumulative ends, 1: counts).
    Returns [y [M, N]]; rows past the last group's end are NaN (undefined on the device).

    Per-token int8 form (formula 3-2 of op-plugin's torch_npu-npu_grouped_matmul.md;
    aclnnGroupedMatmulV4 added "pertoken + perchannel" dynamic quantisation with bfloat16
    and float16 output): x int8, weight int8, scale [[E, N]] float32 or bfloat16,
    per_token_scale [[M]] float32, no bias:  y = (x @ weight[g]) * scale[g] * pts[row]."""
    op = "npu_grouped_matmul"
    quantized = x and x[0].dtype == torch.int8
    unsupported = (offset, antiquant_scale, antiquant_offset, activation_input,
                   activation_quant_scale, activation_quant_offset)
    if any(a is not None for a in unsupported) or act_type or (
            not quantized and (scale is not None or per_token_scale is not None
                               or output_dtype is not None)):
        raise NPUOpError(f"{op}: only the unquantized and the per-token int8 forms are "
                         "simulated (no offset / antiquant / fused activation)")
    if group_type is None:
        raise NPUOpError(f"{op}: Requires manual passing group_type")
    if len(x) != 1 or len(weight) != 1 or group_type != 0 or split_item not in (2, 3):
        raise NPUOpError(f"{op}: simulated form is one x, one 3-D weight, group_type=0, "
                         f"split_item 2 or 3; got {len(x)} x, {len(weight)} weight, "
                         f"group_type={group_type}, split_item={split_item}")
    x0, w = x[0], weight[0]
    check_dim(op, "x", x0, 2)
    check_dim(op, "weight", w, 3)
    if quantized:
        out_dtype = _check_per_token_form(op, x0, w, bias, scale, per_token_scale,
                                          output_dtype)
    else:
        check_dtype(op, "x", x0)
        out_dtype = x0.dtype
    if w.dtype != x0.dtype:
        raise NPUOpError(f"{op}: x is {x0.dtype} but weight is {w.dtype}")
    if not x0.is_contiguous():
        raise NPUOpError(f"{op}: x must be contiguous (x does not support transposition)")
    groups, k, n = w.shape
    if x0.shape[1] != k:
        raise NPUOpError(f"{op}: x {tuple(x0.shape)} does not match weight {tuple(w.shape)}")
    if k >= GMM_MAX_LAST_DIM or n >= GMM_MAX_LAST_DIM:
        raise NPUOpError(f"{op}: last dims must be < {GMM_MAX_LAST_DIM}")
    if groups > GMM_MAX_GROUPS:
        raise NPUOpError(f"{op}: {groups} groups; at most {GMM_MAX_GROUPS}")
    if (group_list is None or group_list.dtype != torch.int64 or group_list.dim() != 1
            or group_list.numel() != groups):
        raise NPUOpError(f"{op}: group_list must be an int64 tensor [{groups}]")
    if group_list_type not in (0, 1):
        raise NPUOpError(f"{op}: group_list_type={group_list_type}; valid: 0 (cumsum), "
                         "1 (counts)")
    if group_list_type == 1 and groups == 1:
        # op-plugin torch_npu-npu_grouped_matmul.md: "group_list_type 1: ... the length
        # cannot be 1" (aclnn_grouped_matmul.cpp checks only != 0; the doc is stricter)
        raise NPUOpError(f"{op}: a count-type group_list (group_list_type=1) cannot have "
                         "length 1; pass one group's end with group_list_type=0")
    values = group_list.tolist()
    counts = values if group_list_type == 1 else [b - a for a, b in zip([0] + values, values)]
    if min(counts) < 0 or sum(counts) > x0.shape[0]:
        raise NPUOpError(f"{op}: group_list {values} (type {group_list_type}) must describe "
                         f"non-negative groups within the {x0.shape[0]} rows of x")
    if bias is not None and (len(bias) != 1 or tuple(bias[0].shape) != (groups, n)):
        raise NPUOpError(f"{op}: bias must be one [{groups}, {n}] tensor")
    if quantized and (tuple(scale[0].shape) != (groups, n)
                      or tuple(per_token_scale[0].shape) != (x0.shape[0],)):
        raise NPUOpError(f"{op}: scale must be one [{groups}, {n}] tensor and per_token_scale "
                         f"one [{x0.shape[0]}] tensor, got {tuple(scale[0].shape)} / "
                         f"{tuple(per_token_scale[0].shape)}")
    out = torch.full((x0.shape[0], n), _UNDEFINED, dtype=out_dtype)
    row = 0
    for g, count in enumerate(counts):
        if count:
            if quantized:  # int32 accumulation, exact in float64 at these sizes
                acc = x0[row:row + count].double() @ w[g].double()
                y = (acc.float() * scale[0][g].float()
                     * per_token_scale[0][row:row + count].unsqueeze(1))
            else:
                y = x0[row:row + count].float() @ w[g].float()
                if bias is not None:
                    y = y + bias[0][g].float()
            out[row:row + count] = y.to(out_dtype)
            row += count
    return [out]


def _check_per_token_form(op, x0, w, bias, scale, per_token_scale, output_dtype):
    """The dtype rules of the per-token int8 form; returns the output dtype."""
    if w.dtype != torch.int8:
        raise NPUOpError(f"{op}: an int8 x needs an int8 weight, got {w.dtype}")
    if bias is not None:
        raise NotImplementedError(f"{op}: the simulator implements the per-token int8 form "
                                  "without bias")
    if not scale or len(scale) != 1 or not per_token_scale or len(per_token_scale) != 1:
        raise NPUOpError(f"{op}: the int8 form needs scale=[one tensor] and "
                         "per_token_scale=[one tensor] (the per-channel int64-scale form "
                         "with int8 output is not simulated)")
    s, pts = scale[0], per_token_scale[0]
    if pts.dtype != torch.float32:
        raise NPUOpError(f"{op}: per_token_scale must be float32, got {pts.dtype}")
    if s.dtype not in (torch.float32, torch.bfloat16):
        raise NPUOpError(f"{op}: with per_token_scale the scale is float32 or bfloat16 "
                         f"(int64 is not supported on Atlas A2/A3), got {s.dtype}")
    # float32 output is a simulation-only extension (exact parity tests)
    if output_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise NPUOpError(f"{op}: output_dtype {output_dtype}; the per-token form outputs "
                         "bfloat16 or float16")
    # The per-token rows of the doc's dtype table: bfloat16 scale -> bfloat16 y, float32
    # scale -> float16 y (vllm-ascend casts the scale to bfloat16 for bf16 models).
    paired = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float32,
              torch.float32: torch.float32}[output_dtype]
    if s.dtype != paired:
        raise NPUOpError(f"{op}: {output_dtype} output takes a {paired} scale in the per-"
                         f"token form, got {s.dtype}")
    return output_dtype


def npu_moe_token_unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                            probs: torch.Tensor | None = None, padded_mode: bool = False,
                            restore_shape=None) -> torch.Tensor:
    """out[t] = sum_k probs[t, k] * permuted_tokens[sorted_indices[t*K + k]] (K = 1 and no
    weights when probs is None). Indices: int32, in range, no duplicates."""
    op = "npu_moe_token_unpermute"
    check_dtype(op, "permuted_tokens", permuted_tokens)
    check_dim(op, "permuted_tokens", permuted_tokens, 2)
    if padded_mode or restore_shape is not None:
        raise NPUOpError(f"{op}: padded_mode must be False and restore_shape None")
    if sorted_indices.dtype != torch.int32 or sorted_indices.dim() != 1:
        raise NPUOpError(f"{op}: sorted_indices must be 1-D int32, got "
                         f"{sorted_indices.dtype} {tuple(sorted_indices.shape)}")
    top_k = 1 if probs is None else probs.shape[-1]
    if top_k > UNPERMUTE_MAX_TOPK or sorted_indices.numel() % top_k:
        raise NPUOpError(f"{op}: topK={top_k} (at most {UNPERMUTE_MAX_TOPK}) must divide "
                         f"the {sorted_indices.numel()} indices")
    num_tokens = sorted_indices.numel() // top_k
    if probs is not None:
        check_dtype(op, "probs", probs)
        if tuple(probs.shape) != (num_tokens, top_k):
            raise NPUOpError(f"{op}: probs {tuple(probs.shape)} must be [{num_tokens}, {top_k}]")
    idx = sorted_indices.long()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= permuted_tokens.shape[0]
                        or idx.unique().numel() != idx.numel()):
        raise NPUOpError(f"{op}: sorted_indices must be distinct rows of permuted_tokens "
                         f"(0..{permuted_tokens.shape[0] - 1})")
    rows = permuted_tokens.float()[idx].view(num_tokens, top_k, -1)
    if probs is None:
        return rows[:, 0].to(permuted_tokens.dtype)
    return (rows * probs.float().unsqueeze(-1)).sum(1).to(permuted_tokens.dtype)
