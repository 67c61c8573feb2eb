"""Which MLA backend the platform gives a model: dense MLA or, for DeepSeek-V3.2-style
models (vLLM's `use_sparse`), sparse MLA; or why neither can run it."""
from __future__ import annotations

from vllm_npu.attention.mla import MLA_BLOCK_SIZE, NPUMLABackend
from vllm_npu.attention.sparse_mla import NPUSparseMLABackend
from vllm_npu.ops.sim.fia_shapes import ATB_MLA_LATENT, ATB_MLA_ROPE


def select_mla_backend(selected_backend, cfg) -> str:
    """The platform's MLA branch: NPUMLABackend's path, or why this model cannot use it."""
    if selected_backend is not None and selected_backend.name not in ("CUSTOM", "NPU_MLA"):
        raise ValueError(f"Attention backend {selected_backend.name} is not available on the "
                         "NPU platform for MLA models; valid: CUSTOM or unset")
    b = NPUSparseMLABackend if cfg.use_sparse else NPUMLABackend
    reasons = [why for bad, why in (
        (not b.supports_head_size(cfg.head_size),
         (f"latent head size {cfg.head_size} (kv_lora_rank + qk_rope_head_dim): the NPU's "
          f"MLA kernels take kv_lora_rank {ATB_MLA_LATENT} and qk_rope_head_dim "
          f"{ATB_MLA_ROPE}")),
        (not b.supports_dtype(cfg.dtype), f"dtype {cfg.dtype}"),
        (not b.supports_kv_cache_dtype(cfg.kv_cache_dtype), f"kv cache {cfg.kv_cache_dtype}"),
        (not b.supports_block_size(cfg.block_size),
         f"block size {cfg.block_size} (needs a multiple of {MLA_BLOCK_SIZE})"),
        (not b.supports_attn_type(cfg.attn_type), f"attention type {cfg.attn_type}"),
        (cfg.has_sliding_window, "sliding window"),
        (cfg.has_sink, "attention sinks"),
    ) if bad]
    if reasons:
        raise ValueError(f"NPU MLA backend cannot run this model: {reasons}")
    return b.full_path()
