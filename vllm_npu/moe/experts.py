"""The grouped expert computation of one rank, all op-surface calls with static shapes:

    pairs (t, j) -> npu_moe_init_routing_v2 -> rows sorted by physical expert, counts
                 -> experts.mlp(rows, counts) -> npu_moe_token_unpermute(probs) -> [T, H]

    float   npu_grouped_matmul(w13) -> npu_swiglu -> npu_grouped_matmul(w2)
    int8    (W8A8_DYNAMIC, as vllm-ascend's quantised MoE MLP)
            npu_dynamic_quant -> npu_grouped_matmul(int8 w13, scale, per_token_scale)
            -> npu_swiglu -> npu_dynamic_quant -> npu_grouped_matmul(int8 w2, ...)

Pairs routed outside this rank's slots [first, first + count) are dropped by the routing
op; they add nothing. Rows past the kept pairs are undefined after the grouped matmuls
(NaN on the simulated NPU): they are zeroed before the weighted sum.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_npu import ops


def _gmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, **quant) -> torch.Tensor:
    return ops.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=counts, split_item=2,
                                  group_type=0, group_list_type=1, **quant)[0]


@dataclass(frozen=True)
class FloatExperts:
    """w13 [S, 2I, H] and w2 [S, H, I] (vLLM's layout; the matmuls take them transposed)."""
    w13: torch.Tensor
    w2: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.w13.shape[0]

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return _gmm(ops.npu_swiglu(_gmm(rows, self.w13, counts)), self.w2, counts)


@dataclass(frozen=True)
class Int8Experts(FloatExperts):
    """int8 w13 [S, 2I, H] and w2 [S, H, I]; per-channel float32 scales [S, 2I] / [S, H].
    Activations are quantised per token (symmetric) before each grouped matmul."""
    w13_scale: torch.Tensor
    w2_scale: torch.Tensor

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        out_dtype = rows.dtype
        rows_q, rows_scale = ops.npu_dynamic_quant(rows)
        gate_up = _gmm(rows_q, self.w13, counts, scale=[self.w13_scale],
                       per_token_scale=[rows_scale], output_dtype=out_dtype)
        act_q, act_scale = ops.npu_dynamic_quant(ops.npu_swiglu(gate_up))
        return _gmm(act_q, self.w2, counts, scale=[self.w2_scale],
                    per_token_scale=[act_scale], output_dtype=out_dtype)


Experts = FloatExperts  # or its int8 subclass


def run_local_experts(x: torch.Tensor, weights: torch.Tensor, slots: torch.Tensor,
                      experts: Experts, first: int, num_physical: int) -> torch.Tensor:
    """x [T, H]; weights [T, k]; slots [T, k] int32 physical ids."""
    num_tokens, top_k = slots.shape
    expanded, row_idx, counts, _ = ops.npu_moe_init_routing_v2(
        x, slots, active_num=num_tokens * top_k, expert_num=num_physical,
        expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=[first, first + experts.num_slots], row_idx_type=0)
    return combine(experts.mlp(expanded, counts), row_idx, counts, weights)


def combine(rows: torch.Tensor, row_idx: torch.Tensor, counts: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum of each token's expert rows. Dropped pairs (row_idx -1) point at the
    zeroed tail rows, one each, as the unpermute op wants distinct indices."""
    kept = counts.sum()
    position = torch.arange(rows.shape[0], device=rows.device)
    rows = torch.where((position < kept).unsqueeze(1), rows, torch.zeros_like(rows))
    dropped = row_idx < 0
    tail = kept + torch.cumsum(dropped.to(torch.int64), 0) - 1
    index = torch.where(dropped, tail, row_idx.to(torch.int64)).to(torch.int32)
    probs = weights.masked_fill(dropped.view_as(weights), 0).to(rows.dtype)
    return ops.npu_moe_token_unpermute(rows, index, probs)
