"""Simulated device-to-device copies by address (CANN `aclrtMemcpy`, kind
ACL_MEMCPY_DEVICE_TO_DEVICE): the simulated NPU's memory is host memory."""
from __future__ import annotations

import ctypes

import torch

from vllm_npu.ops.sim.checks import NPUOpError


def npu_batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor,
                     sizes: torch.Tensor) -> None:
    """Copy sizes[i] bytes from src_ptrs[i] to dst_ptrs[i] for every i (int64 tensors)."""
    if not (src_ptrs.shape == dst_ptrs.shape == sizes.shape) or src_ptrs.dim() != 1:
        raise NPUOpError(f"npu_batch_memcpy: src {tuple(src_ptrs.shape)}, dst "
                         f"{tuple(dst_ptrs.shape)} and sizes {tuple(sizes.shape)} must be "
                         "1-D of one length")
    for src, dst, size in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist()):
        if size < 0:
            raise NPUOpError(f"npu_batch_memcpy: negative size {size}")
        ctypes.memmove(dst, src, size)
