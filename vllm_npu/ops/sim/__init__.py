"""The simulated NPU's ops: plain PyTorch on the CPU with torch_npu's conventions."""
from vllm_npu.ops.sim.activation import npu_swiglu
from vllm_npu.ops.sim.attention import _npu_paged_attention, npu_fused_infer_attention_score
from vllm_npu.ops.sim.cache import _npu_reshape_and_cache
from vllm_npu.ops.sim.norm import npu_add_rms_norm, npu_rms_norm
from vllm_npu.ops.sim.rotary import npu_rotary_mul

__all__ = ["npu_swiglu", "_npu_paged_attention", "npu_fused_infer_attention_score",
           "_npu_reshape_and_cache", "npu_add_rms_norm", "npu_rms_norm", "npu_rotary_mul"]
