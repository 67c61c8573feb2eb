"""RMSNorm (with fused residual add) through `npu_rms_norm` / `npu_add_rms_norm`."""
from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import RMSNorm

from vllm_npu import ops
from vllm_npu.layers import replaces


@replaces(RMSNorm)
class NPURMSNorm(RMSNorm):
    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.variance_size_override is not None:
            # Norm over a prefix of the hidden dim: no device op for that; stay exact.
            return self.forward_native(x, residual)
        weight = self.weight.data if self.has_weight else self.weight.to(x)
        if residual is None:
            return ops.npu_rms_norm(x, weight, self.variance_epsilon)[0]
        y, _, x_sum = ops.npu_add_rms_norm(x, residual, weight, self.variance_epsilon)
        return y, x_sum
