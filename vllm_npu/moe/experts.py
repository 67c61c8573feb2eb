"""The grouped expert computation of one rank, all op-surface calls with static shapes:

    pairs (t, j) -> npu_moe_init_routing_v2 -> rows sorted by physical expert, counts
                 -> npu_grouped_matmul(w13) -> npu_swiglu -> npu_grouped_matmul(w2)
                 -> npu_moe_token_unpermute(probs = routing weights) -> [T, H]

Pairs routed outside this rank's slots [first, first + count) are dropped by the routing
op; they add nothing. Rows past the kept pairs are undefined after the grouped matmuls
(NaN on the simulated NPU): they are zeroed before the weighted sum.
"""
from __future__ import annotations

import torch

from vllm_npu import ops


def run_local_experts(x: torch.Tensor, weights: torch.Tensor, slots: torch.Tensor,
                      w13: torch.Tensor, w2: torch.Tensor, first: int,
                      num_physical: int) -> torch.Tensor:
    """x [T, H]; weights [T, k]; slots [T, k] int32 physical ids; w13 [S, 2I, H] and
    w2 [S, H, I] (vLLM's layout, passed to the grouped matmul transposed)."""
    num_tokens, top_k = slots.shape
    local = w13.shape[0]
    expanded, row_idx, counts, _ = ops.npu_moe_init_routing_v2(
        x, slots, active_num=num_tokens * top_k, expert_num=num_physical,
        expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=[first, first + local], row_idx_type=0)
    gate_up = ops.npu_grouped_matmul([expanded], [w13.transpose(1, 2)], group_list=counts,
                                     split_item=2, group_type=0, group_list_type=1)[0]
    down = ops.npu_grouped_matmul([ops.npu_swiglu(gate_up)], [w2.transpose(1, 2)],
                                  group_list=counts, split_item=2, group_type=0,
                                  group_list_type=1)[0]
    return combine(down, row_idx, counts, weights)


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
