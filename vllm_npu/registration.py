"""Everything the `vllm.general_plugins` entry point registers; idempotent, every process."""
from __future__ import annotations

import logging

logger = logging.getLogger("vllm.npu")
_done = False
ATTENTION_BACKEND = "vllm_npu.attention.backend.NPUAttentionBackend"


def register_all() -> None:
    global _done
    if _done:
        return
    from vllm_npu.device import plugin_active, select_backend

    if not plugin_active():
        return
    _done = True
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    # Importing the modules runs their @register_oot decorators.
    import vllm_npu.layers.activation  # noqa: F401
    import vllm_npu.layers.fused_moe  # noqa: F401
    import vllm_npu.layers.gated_delta_net  # noqa: F401
    import vllm_npu.layers.layernorm  # noqa: F401
    import vllm_npu.layers.mamba_mixer2  # noqa: F401
    import vllm_npu.layers.mm_encoder_attention  # noqa: F401
    import vllm_npu.attention.mla_layer  # noqa: F401
    import vllm_npu.layers.rotary_embedding  # noqa: F401
    if select_backend().simulated:  # the simulated device's matmul (layers/linear.py)
        import vllm_npu.layers.linear  # noqa: F401
    import vllm_npu.quantization.compressed_int8  # noqa: F401  (compressed-tensors int8)
    import vllm_npu.quantization.modelslim  # noqa: F401  (registers --quantization ascend)
    from vllm_npu.patch import apply_all

    register_backend(AttentionBackendEnum.CUSTOM, ATTENTION_BACKEND)
    apply_all()
    logger.debug("vllm_npu: registered CustomOp OOT layers and the NPU attention backend")
