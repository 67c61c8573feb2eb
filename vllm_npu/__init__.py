"""vllm_npu: the Ascend NPU platform plugin for vLLM (real NPU or simulated on CPU)."""


def register() -> str | None:
    """`vllm.platform_plugins` entry point: the platform class path, or None to stay out."""
    from vllm_npu.device import plugin_active

    return "vllm_npu.platform.NPUPlatform" if plugin_active() else None


def register_ops() -> None:
    """`vllm.general_plugins` entry point: CustomOp OOT layers and the attention backend."""
    from vllm_npu.registration import register_all

    register_all()
