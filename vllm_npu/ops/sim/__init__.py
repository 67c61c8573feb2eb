"""The simulated NPU's ops: plain PyTorch on the CPU with torch_npu's conventions.

Every op is graph-aware (`graph.graph_op`): under a simulated graph capture it is recorded
as one task whose arguments stay frozen until a task update refreshes them.
"""
from vllm_npu.ops.sim import (
    activation,
    attention,
    attention_update,
    attention_v2,
    cache,
    gdn,
    linear,
    lora,
    mamba,
    mla,
    moe,
    norm,
    quant,
    rotary,
    sparse_attention,
    state_copy,
    vision_attention,
)
from vllm_npu.ops.sim.graph import graph_op
from vllm_npu.ops.sim.opaque import opaque

# Row ops whose replays launch their kernels into the captured outputs (`replay_launch`).
# The ops model layers call are opaque custom ops for Dynamo (opaque.py), as a device's are.
npu_swiglu = opaque("npu_swiglu", graph_op(activation.npu_swiglu,
                                           replay_launch=activation.swiglu_launch))
npu_rms_norm = opaque("npu_rms_norm", graph_op(norm.npu_rms_norm,
                                               replay_launch=norm.rms_norm_launch))
npu_add_rms_norm = opaque("npu_add_rms_norm", graph_op(norm.npu_add_rms_norm,
                                                       replay_launch=norm.add_rms_norm_launch))
npu_rotary_mul = opaque("npu_rotary_mul", graph_op(rotary.npu_rotary_mul,
                                                   replay_launch=rotary.rotary_mul_launch))
npu_clipped_swiglu = graph_op(activation.npu_clipped_swiglu)
# The linear layers' matmul (not a graph op: its aten calls are recorded as they run).
device_matmul = opaque("device_matmul", linear.linear)
# Host-side arguments (frozen into a task at capture / update; see graph.graph_op): the
# sequence lengths torch_npu takes as host lists (FIA `actual_seq_lengths(_kv)`, op-plugin
# `IntArrayRef`) or host int32 tensors (ATB paged attention `context_lens`, read on the host
# for tiling).
_FIA_HOST = ("actual_seq_lengths", "actual_seq_lengths_kv")
npu_fused_infer_attention_score = graph_op(attention.npu_fused_infer_attention_score,
                                           host_args=_FIA_HOST)
npu_fused_infer_attention_score_out = graph_op(attention.npu_fused_infer_attention_score_out,
                                               host_args=_FIA_HOST, workspace=True)
npu_fused_infer_attention_score_v2_out = graph_op(
    attention_v2.npu_fused_infer_attention_score_v2_out,
    host_args=("actual_seq_qlen", "actual_seq_kvlen"), workspace=True)
_npu_paged_attention = graph_op(attention._npu_paged_attention, host_args=("context_lens",),
                                workspace=True, launcher=attention.paged_attention_launch,
                                relaunch=attention.paged_attention_relaunch)
# Workspace queries run on the host before capture / update: not graph ops.
_npu_fused_infer_attention_score_get_max_workspace = \
    attention._npu_fused_infer_attention_score_get_max_workspace
_npu_paged_attention_get_workspace = attention._npu_paged_attention_get_workspace
_npu_fused_infer_attention_score_v2_get_max_workspace = \
    attention_v2._npu_fused_infer_attention_score_v2_get_max_workspace
_npu_reshape_and_cache = graph_op(cache._npu_reshape_and_cache,
                                  launcher=cache.reshape_and_cache_launch)
npu_multi_head_latent_attention = graph_op(mla.npu_multi_head_latent_attention,
                                           host_args=("context_lens",))
npu_attention_update = graph_op(attention_update.npu_attention_update)
npu_moe_gating_top_k = graph_op(moe.npu_moe_gating_top_k)
npu_moe_init_routing_v2 = graph_op(moe.npu_moe_init_routing_v2)
npu_grouped_matmul = graph_op(moe.npu_grouped_matmul)
npu_moe_token_unpermute = graph_op(moe.npu_moe_token_unpermute)
npu_quantize = opaque("npu_quantize", graph_op(quant.npu_quantize))
npu_dynamic_quant = opaque("npu_dynamic_quant", graph_op(quant.npu_dynamic_quant))
npu_quant_matmul = opaque("npu_quant_matmul", graph_op(quant.npu_quant_matmul))
npu_bgmv_shrink = graph_op(lora.npu_bgmv_shrink)
npu_bgmv_expand = graph_op(lora.npu_bgmv_expand)
npu_sgmv_shrink = graph_op(lora.npu_sgmv_shrink)
npu_sgmv_expand = graph_op(lora.npu_sgmv_expand)
# Mamba-2: prefills read their request bounds on the host (eager); decodes are graph tasks
# whose state rows and indices are device data read at replay.
npu_causal_conv1d = graph_op(mamba.npu_causal_conv1d)
npu_mamba_chunk_scan = graph_op(mamba.npu_mamba_chunk_scan)
npu_causal_conv1d_update = graph_op(mamba.npu_causal_conv1d_update)
npu_selective_state_update = graph_op(mamba.npu_selective_state_update)
# Gated DeltaNet: the chunked rule for prefills (host request lengths, eager), the
# recurrent step for decodes (a graph task: state rows and indices are device data).
npu_chunk_gated_delta_rule = graph_op(gdn.npu_chunk_gated_delta_rule,
                                      host_args=("actual_seq_lengths",))
npu_recurrent_gated_delta_rule = graph_op(gdn.npu_recurrent_gated_delta_rule)
npu_batch_memcpy = state_copy.npu_batch_memcpy  # host-driven copies: not a graph task
# DeepSeek-V3.2: the indexer's key write, its top-k and sparse MLA attention; lengths,
# block tables and indices are device int32 tensors read at replay.
_npu_reshape_and_cache_siso = graph_op(cache._npu_reshape_and_cache_siso)
npu_lightning_indexer = graph_op(sparse_attention.npu_lightning_indexer)
npu_sparse_flash_attention = graph_op(sparse_attention.npu_sparse_flash_attention)
# Vision encoders' attention (no KV cache): its lengths are a host int32 tensor.
_npu_flash_attention_unpad = graph_op(vision_attention._npu_flash_attention_unpad,
                                      host_args=("seq_len",))
