"""Expert selection through `npu_moe_gating_top_k`, configured from vLLM's MoE layer.

    model family            scoring   groups           bias (noaux_tc)   weights
    Qwen3-MoE / Mixtral     softmax   -                -                 renormalised top-k
    DeepSeek-V2             softmax   max per group    -                 raw or renormalised
    DeepSeek-V3 / R1        sigmoid   top-2 sum        e_score_corr.     renormalised

A model's custom routing function replaces the op (select_experts). torch_npu's op
renormalises sigmoid weights always and softmax weights never (`renorm` must be 0), so
softmax + renormalize divides afterwards and sigmoid without renormalize is refused.
`routed_scaling_factor` is the layer's: vLLM's DeepSeek model passes it to the runner
instead (`apply_routed_scale_to_output`), leaving 1.0 here, so it is applied exactly once.
"""
from __future__ import annotations

import torch

from vllm_npu import ops
from vllm_npu.ops.sim.moe import GATING_MAX_EXPERTS


def _groups(layer) -> tuple[int, int]:
    groups = (layer.num_expert_group or 1) if layer.use_grouped_topk else 1
    topk_group = (layer.topk_group or 1) if groups > 1 else 1
    return groups, topk_group


def routing_problems(layer, num_experts: int) -> list[str]:
    """Why the NPU MoE path cannot route this layer (empty when it can)."""
    problems = []
    scoring = layer.scoring_func
    if layer.apply_router_weight_on_input and layer.top_k != 1:
        problems.append(f"router weights applied on the input with top_k={layer.top_k} "
                        "(valid: top_k 1)")
    if layer.custom_routing_function is not None:
        return problems  # the model's own selection (below): no gating-op limits apply
    if scoring not in ("softmax", "sigmoid"):
        problems.append(f"scoring_func={scoring!r} (valid: 'softmax', 'sigmoid')")
    if scoring == "sigmoid" and not layer.renormalize:
        problems.append("sigmoid scoring without renormalisation (norm_topk_prob=False): "
                        "npu_moe_gating_top_k always renormalises sigmoid weights")
    if getattr(layer, "hash_indices_table", None) is not None:
        problems.append("hash routing")
    groups, topk_group = _groups(layer)
    per_group = num_experts // groups
    top_k = layer.top_k
    if num_experts > GATING_MAX_EXPERTS:
        problems.append(f"{num_experts} experts (npu_moe_gating_top_k takes at most "
                        f"{GATING_MAX_EXPERTS})")
    if num_experts % groups or per_group <= 2:
        problems.append(f"n_group={groups} for {num_experts} experts (groups must split the "
                        "experts evenly into groups of more than 2)")
    elif not 1 <= topk_group <= groups or top_k > per_group * topk_group:
        problems.append(f"top_k={top_k} with topk_group={topk_group} of n_group={groups} "
                        f"(top_k must be at most {per_group} x topk_group)")
    return problems


def select_experts(layer, x: torch.Tensor,
                   router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] float, logical topk_ids [T, k] int32). A model's custom routing
    function (Llama 4: sigmoid of the top-1 logit) is plain tensor ops: it runs as the
    model wrote it, on the device too (vllm-ascend likewise keeps vLLM's
    CustomRoutingRouter for it, router_factory.py)."""
    custom = layer.custom_routing_function
    if custom is not None:
        weights, ids = custom(hidden_states=x, gating_output=router_logits,
                              topk=layer.top_k, renormalize=layer.renormalize)
        return weights, ids.to(torch.int32)
    groups, topk_group = _groups(layer)
    bias = layer.e_score_correction_bias
    if bias is not None:
        bias = bias.to(router_logits.dtype)
    softmax = layer.scoring_func == "softmax"
    scale = layer.routed_scaling_factor
    renorm_after = softmax and layer.renormalize
    weights, ids, _ = ops.npu_moe_gating_top_k(
        router_logits, layer.top_k, bias=bias, k_group=topk_group, group_count=groups,
        group_select_mode=0 if bias is None else 1, renorm=0,
        norm_type=0 if softmax else 1, out_flag=False,
        routed_scaling_factor=1.0 if renorm_after else scale, eps=1e-20)
    if renorm_after:
        weights = weights / weights.sum(-1, keepdim=True)
        if scale != 1.0:
            weights = weights * scale
    return weights, ids
