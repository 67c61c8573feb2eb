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

from dataclasses import dataclass, field

import torch

from vllm_npu import ops


def _gmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, **quant) -> torch.Tensor:
    # One slot per rank (e.g. 8 experts over EP 8): the doc allows no count-type list of
    # length 1; a single group's count is also its end, so it goes as type 0 (cumsum).
    list_type = 0 if counts.shape[0] == 1 else 1
    return ops.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=counts, split_item=2,
                                  group_type=0, group_list_type=list_type, **quant)[0]


def _biased(bias: torch.Tensor | None) -> dict:
    # float32 bias beside float inputs (vllm-ascend moe_mlp.py passes w1_bias.to(float32))
    return {} if bias is None else {"bias": [bias.float()]}


@dataclass(frozen=True)
class FloatExperts:
    """w13 [S, 2I, H] and w2 [S, H, I] (vLLM's layout; the matmuls take them transposed);
    optional biases w13_bias [S, 2I] / w2_bias [S, H]. `clipped`: gpt-oss's clamped SwiGLU
    on interleaved gate/up features (`npu_clipped_swiglu`), else SwiGLU on halves."""
    w13: torch.Tensor
    w2: torch.Tensor
    w13_bias: torch.Tensor | None = field(default=None, kw_only=True)
    w2_bias: torch.Tensor | None = field(default=None, kw_only=True)
    clipped: bool = field(default=False, kw_only=True)

    @property
    def num_slots(self) -> int:
        return self.w13.shape[0]

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.npu_clipped_swiglu(gate_up) if self.clipped else ops.npu_swiglu(gate_up)

    def mlp(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        gate_up = _gmm(rows, self.w13, counts, **_biased(self.w13_bias))
        return _gmm(self._act(gate_up), self.w2, counts, **_biased(self.w2_bias))


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
