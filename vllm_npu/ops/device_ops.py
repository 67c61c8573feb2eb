"""The op surface on a real NPU: the same names and arguments, forwarded to torch_npu."""
from __future__ import annotations

import torch_npu  # noqa: F401  (only imported when select_backend() found a device)

npu_rms_norm = torch_npu.npu_rms_norm
npu_add_rms_norm = torch_npu.npu_add_rms_norm
npu_rotary_mul = torch_npu.npu_rotary_mul
npu_swiglu = torch_npu.npu_swiglu
npu_clipped_swiglu = torch_npu.npu_clipped_swiglu
npu_fused_infer_attention_score = torch_npu.npu_fused_infer_attention_score
_npu_flash_attention_unpad = torch_npu._npu_flash_attention_unpad
npu_attention_update = torch_npu.npu_attention_update
npu_multi_head_latent_attention = torch_npu.atb.npu_multi_head_latent_attention
npu_moe_gating_top_k = torch_npu.npu_moe_gating_top_k
npu_moe_init_routing_v2 = torch_npu.npu_moe_init_routing_v2
npu_grouped_matmul = torch_npu.npu_grouped_matmul
npu_moe_token_unpermute = torch_npu.npu_moe_token_unpermute
npu_quantize = torch_npu.npu_quantize
npu_dynamic_quant = torch_npu.npu_dynamic_quant
npu_quant_matmul = torch_npu.npu_quant_matmul


def npu_fused_infer_attention_score_out(query, key, value, *, out, workspace=None, **kwargs):
    if workspace is None:
        workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
            query, key, value, **kwargs)
    torch_npu.npu_fused_infer_attention_score.out(query, key, value, workspace=workspace,
                                                  out=out, **kwargs)


_npu_fused_infer_attention_score_get_max_workspace = \
    torch_npu._npu_fused_infer_attention_score_get_max_workspace
_npu_fused_infer_attention_score_v2_get_max_workspace = \
    torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace


def npu_fused_infer_attention_score_v2_out(query, key, value, *, out, workspace=None, **kwargs):
    if workspace is None:
        workspace = _npu_fused_infer_attention_score_v2_get_max_workspace(query, key, value,
                                                                          **kwargs)
    torch_npu.npu_fused_infer_attention_score_v2.out(query, key, value, workspace=workspace,
                                                     out=out, **kwargs)


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                         block_table, context_lens, out, workspace=None):
    extra = {} if workspace is None else {"workspace": workspace}
    torch_npu._npu_paged_attention(query=query, key_cache=key_cache, value_cache=value_cache,
                                   num_kv_heads=num_kv_heads, num_heads=num_heads,
                                   scale_value=scale_value, block_table=block_table,
                                   context_lens=context_lens, out=out, **extra)


def _npu_paged_attention_get_workspace(query, key_cache, value_cache, num_kv_heads, num_heads,
                                       scale_value, block_table, context_lens, out):
    return torch_npu._npu_paged_attention_get_workspace(
        query=query, key_cache=key_cache, value_cache=value_cache, num_kv_heads=num_kv_heads,
        num_heads=num_heads, scale_value=scale_value, block_table=block_table,
        context_lens=context_lens, out=out)


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    torch_npu._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache,
                                     value_cache=value_cache, slot_indices=slot_indices)


# Multi-LoRA: no torch_npu / CANN op exists (vllm-ascend builds its own AscendC kernels),
# so a device runs vLLM's torch-native implementation with the surface's argument order.
def npu_bgmv_shrink(x, weights, indices, y, scale):
    from vllm.lora.ops.torch_ops import bgmv_shrink

    bgmv_shrink(x, weights, y, indices, scale)


def npu_bgmv_expand(x, weights, indices, y, slice_offset, slice_size):
    from vllm.lora.ops.torch_ops import bgmv_expand_slice

    bgmv_expand_slice(x, weights, y, indices, slice_offset, slice_size, True)


def npu_sgmv_shrink(x, weights, indices, seq_len, y, scale):
    import torch

    npu_bgmv_shrink(x, weights, torch.repeat_interleave(indices, seq_len), y, scale)


def npu_sgmv_expand(x, weights, indices, seq_len, y, slice_offset, slice_size):
    import torch

    npu_bgmv_expand(x, weights, torch.repeat_interleave(indices, seq_len), y, slice_offset,
                    slice_size)


# Mamba-2 and Gated DeltaNet: vllm-ascend runs AscendC / Triton-Ascend kernels for these
# (npu_causal_conv1d_custom, torch_npu.npu_chunk_gated_delta_rule,
# npu_recurrent_gated_delta_rule; no Mamba-2 SSD kernel). Their argument conventions are
# unverified here, so a device runs the simulator's plain-PyTorch twins (correct, not
# fast); docs/device.md lists them.
from vllm_npu.ops.sim.gdn import (  # noqa: E402, F401 (the surface re-exports them)
    npu_chunk_gated_delta_rule,
    npu_recurrent_gated_delta_rule,
)
from vllm_npu.ops.sim.mamba import (  # noqa: E402, F401
    npu_causal_conv1d,
    npu_causal_conv1d_update,
    npu_mamba_chunk_scan,
    npu_selective_state_update,
)

# DeepSeek-V3.2 sparse attention: vllm-ascend builds the lightning indexer and sparse flash
# attention as its own AscendC ops (torch.ops._C_ascend, csrc/torch_binding.cpp), which
# this plugin does not ship; a device runs the simulator's plain-PyTorch twins with the
# same arguments (correct, not fast; docs/device.md). The indexer cache write is ATB's.
from vllm_npu.ops.sim.sparse_attention import (  # noqa: E402, F401
    npu_lightning_indexer,
    npu_sparse_flash_attention,
)

_npu_reshape_and_cache_siso = torch_npu._npu_reshape_and_cache_siso


def npu_batch_memcpy(src_ptrs, dst_ptrs, sizes):
    """Device-to-device copies by address: CANN's aclrtMemcpy (dst, destMax, src, count,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3), one per triple, on the current device. Unverified on
    a device (docs/device.md)."""
    import ctypes

    acl = ctypes.CDLL("libascendcl.so")
    for src, dst, size in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist()):
        status = acl.aclrtMemcpy(ctypes.c_void_p(dst), ctypes.c_size_t(size),
                                 ctypes.c_void_p(src), ctypes.c_size_t(size), 3)
        if status != 0:
            raise RuntimeError(f"aclrtMemcpy failed with status {status}")
