"""Attention with logit soft-capping (Gemma 2), composed of plain tensor ops.

No Ascend attention kernel takes a soft cap: FIA v1/v2, PFA, IFA, `npu_fusion_attention`
and ATB paged attention have no such argument (op-plugin op_plugin_functions.yaml;
vllm-ascend accepts `logits_soft_cap` and drops it). Capping sits between the scores and
the softmax, so no fused kernel can be corrected afterwards. These layers therefore run a
composition of aten ops (gather, matmul, tanh, softmax) that torch_npu runs on the device
as it does on the CPU:

    s = scale * q.k;   s = cap * tanh(s / cap);   causal (and band) mask;   softmax . v

It reads the paged cache with host lengths, request by request, so it runs eagerly only:
a model with soft-capped layers gets no FULL graphs (the builder reports NEVER), and the
piecewise modes run attention between their pieces anyway.
"""
from __future__ import annotations

import torch


def softcap_attention(q: torch.Tensor, k_heads: torch.Tensor, v_heads: torch.Tensor,
                      block_table: torch.Tensor, query_ends: list[int], kv_lens: list[int],
                      scale: float, cap: float, sliding_window: int | None,
                      out: torch.Tensor) -> None:
    """q [T, H, D]; k/v_heads [num_blocks, block_size, Hkv, D] (the cache planes);
    block_table [B, max_blocks]; per request its cumulative query end and kv length
    (its new tokens are the last of its kv). Writes out [T, H, D]."""
    block_size, kv_heads = k_heads.shape[1], k_heads.shape[2]
    group = q.shape[1] // kv_heads
    start = 0
    for row, (end, kv) in enumerate(zip(query_ends, kv_lens)):
        n, start = end - start, end
        if n == 0:
            continue
        blocks = block_table[row, :-(-kv // block_size)].long()
        k = k_heads[blocks].flatten(0, 1)[:kv].float().repeat_interleave(group, dim=1)
        v = v_heads[blocks].flatten(0, 1)[:kv].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[end - n:end].float(), k) * scale
        scores = cap * torch.tanh(scores / cap)
        pos_q = torch.arange(kv - n, kv, device=q.device).unsqueeze(1)
        pos_k = torch.arange(kv, device=q.device).unsqueeze(0)
        allowed = pos_k <= pos_q
        if sliding_window is not None:
            allowed &= pos_k > pos_q - sliding_window  # the last `sliding_window` keys
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        out[end - n:end] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
