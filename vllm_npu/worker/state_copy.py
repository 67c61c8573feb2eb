"""Mamba-style state copies between KV-cache blocks (prefix caching in vLLM's 'align'
mode moves a request's running state to the block its next chunk continues from):
vLLM launches a Triton kernel over (src, dst, bytes) address triples; on the NPU it is
replaced (`Platform.register_triton_kernel_overrides`) by one memory copy per triple."""
from __future__ import annotations

import torch

from vllm_npu import ops

KERNEL = "vllm.v1.worker.mamba_utils.batch_memcpy_kernel"


def batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor,
                 BLOCK_SIZE: int | None = None) -> None:  # noqa: N803 (the kernel's name)
    ops.npu_batch_memcpy(src_ptrs, dst_ptrs, sizes)
