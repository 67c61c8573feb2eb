"""SiluAndMul through `npu_swiglu`."""
from __future__ import annotations

import torch
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_npu import ops
from vllm_npu.layers import replaces


@replaces(SiluAndMul)
class NPUSiluAndMul(SiluAndMul):
    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return ops.npu_swiglu(x, dim=-1)
