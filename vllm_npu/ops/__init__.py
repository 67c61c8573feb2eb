"""The device-op surface: every op the plugin calls, named and shaped like torch_npu's.

On a real NPU these are torch_npu's ops (`device_ops`); otherwise the simulated ones
(`ops.sim`). The choice is made once, at import, from `vllm_npu.device.select_backend()`;
everything above the leaves (layers, attention backend, runner) is the same code on both.
"""
from vllm_npu.device import select_backend

OP_NAMES = (
    "npu_rms_norm",
    "npu_add_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "npu_clipped_swiglu",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_out",
    "npu_fused_infer_attention_score_v2_out",
    "_npu_fused_infer_attention_score_v2_get_max_workspace",
    "_npu_paged_attention",
    "_npu_fused_infer_attention_score_get_max_workspace",
    "_npu_paged_attention_get_workspace",
    "_npu_reshape_and_cache",
    "npu_attention_update",
    "npu_multi_head_latent_attention",
    "npu_moe_gating_top_k",
    "npu_moe_init_routing_v2",
    "npu_grouped_matmul",
    "npu_moe_token_unpermute",
    "npu_quantize",
    "npu_dynamic_quant",
    "npu_quant_matmul",
    "npu_bgmv_shrink",
    "npu_bgmv_expand",
    "npu_sgmv_shrink",
    "npu_sgmv_expand",
    "npu_causal_conv1d",
    "npu_causal_conv1d_update",
    "npu_mamba_chunk_scan",
    "npu_selective_state_update",
    "npu_chunk_gated_delta_rule",
    "npu_recurrent_gated_delta_rule",
    "npu_batch_memcpy",
    "_npu_reshape_and_cache_siso",
    "npu_lightning_indexer",
    "npu_sparse_flash_attention",
    "_npu_flash_attention_unpad",
)

if select_backend().simulated:
    from vllm_npu.ops import sim as _impl
else:
    from vllm_npu.ops import device_ops as _impl

globals().update({name: getattr(_impl, name) for name in OP_NAMES})
