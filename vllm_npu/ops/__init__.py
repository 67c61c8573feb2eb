"""The device-op surface: every op the plugin calls, named and shaped like torch_npu's.

On a real NPU these are torch_npu's ops; otherwise the simulated ones (`ops.sim`). The
choice is made once, at import, from `vllm_npu.device.select_backend()`; everything above
the leaves (layers, attention backend, runner) is the same code on both.
"""
from vllm_npu.device import select_backend

if select_backend().simulated:
    from vllm_npu.ops.sim import (  # noqa: F401
        _npu_paged_attention,
        _npu_reshape_and_cache,
        npu_add_rms_norm,
        npu_fused_infer_attention_score,
        npu_rms_norm,
        npu_rotary_mul,
        npu_swiglu,
    )
else:
    from vllm_npu.ops.device_ops import (  # noqa: F401
        _npu_paged_attention,
        _npu_reshape_and_cache,
        npu_add_rms_norm,
        npu_fused_infer_attention_score,
        npu_rms_norm,
        npu_rotary_mul,
        npu_swiglu,
    )
