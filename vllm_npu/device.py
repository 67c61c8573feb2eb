"""Which device backs the plugin: a real Ascend NPU, the simulated one, or none.

    real NPU   torch_npu imports (CANN libraries present) and reports >= 1 device
    simulated  otherwise, or when NPU_PLUGIN_SIMULATE=1: plain PyTorch on the CPU
    inactive   NPU_PLUGIN_DISABLE=1, or another accelerator platform (CUDA, ROCm,
               XPU, TPU) is present: the plugin never hijacks a GPU machine
"""
from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass

from vllm_npu import envs

logger = logging.getLogger("vllm.npu")  # under "vllm": uses vLLM's log handlers


@dataclass(frozen=True)
class DeviceBackend:
    simulated: bool
    reason: str

    @property
    def name(self) -> str:
        return "simulated NPU" if self.simulated else "Ascend NPU"


def other_accelerator() -> str | None:
    """Name of another accelerator platform vLLM itself would detect, if any."""
    from vllm.platforms import builtin_platform_plugins

    for name in ("cuda", "rocm", "xpu", "tpu"):
        try:
            if builtin_platform_plugins[name]() is not None:
                return name
        except Exception:  # a detector failing means that platform is absent
            continue
    return None


def plugin_active() -> bool:
    """Cheap and free of side effects: vLLM calls it twice per process."""
    if envs.NPU_PLUGIN_DISABLE.get():
        return False
    return other_accelerator() is None


def _probe_torch_npu() -> str | None:
    """None when a real NPU is usable, else why not."""
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu not installed"
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # ImportError/OSError when CANN's libhccl.so etc. are missing
        return f"torch_npu not importable: {e}"
    import torch

    try:
        count = torch.npu.device_count()
    except Exception as e:
        return f"torch.npu.device_count() failed: {e}"
    return None if count > 0 else "torch_npu found no NPU device"


@functools.cache
def select_backend() -> DeviceBackend:
    """Decide once per process (logged by `log_backend`, once vLLM's logging is set up)."""
    if envs.NPU_PLUGIN_SIMULATE.get():
        backend = DeviceBackend(True, "NPU_PLUGIN_SIMULATE=1")
    else:
        why_not = _probe_torch_npu()
        backend = DeviceBackend(why_not is not None, why_not or "torch_npu reports an NPU")
    return backend


@functools.cache
def log_backend() -> None:
    from vllm_npu.versions import log_versions

    backend = select_backend()
    logger.info("vllm_npu: %s → %s", backend.reason, backend.name)
    log_versions(backend.name)
