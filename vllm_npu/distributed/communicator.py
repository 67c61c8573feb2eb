"""NPUCommunicator: the platform's device communicator.

In simulation the device group is a gloo group over CPU tensors, so vLLM's base
communicator (torch.distributed collectives on the device group) is exactly right; on a
device the same calls run over torch_npu's HCCL process-group backend.
"""
from __future__ import annotations

from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)


class NPUCommunicator(DeviceCommunicatorBase):
    """torch.distributed collectives on the NPU device group (hccl) or its gloo stand-in."""
