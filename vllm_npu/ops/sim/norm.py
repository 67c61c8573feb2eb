"""Simulated `torch_npu.npu_rms_norm` / `npu_add_rms_norm`: statistics in float32."""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_dtype, check_same_dtype


def _rms(op: str, x: torch.Tensor, gamma: torch.Tensor, epsilon: float):
    check_dtype(op, "x", x)
    check_same_dtype(op, x=x, gamma=gamma)
    if gamma.shape != x.shape[-gamma.dim():]:
        raise NPUOpError(f"{op}: gamma shape {tuple(gamma.shape)} must match the trailing "
                         f"dims of x {tuple(x.shape)}")
    if x.dtype == torch.float32:
        # one pass instead of six ops; bitwise equal to the formula below for float32
        # (tests/ops/test_elementwise_ops.py holds it), not for bf16/fp16, where the
        # formula rounds (x * rstd) to the input dtype before the weight multiply
        return torch.ops.aten._fused_rms_norm(x, list(gamma.shape), gamma, epsilon)
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (xf * rstd).to(x.dtype) * gamma
    return y, rstd


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    """Returns (y, rstd); rstd is float32 with the normalised dims kept as size 1."""
    return _rms("npu_rms_norm", x, gamma, epsilon)


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6):
    """Returns (y, rstd, x) where x = x1 + x2 and y = rms_norm(x) * gamma."""
    op = "npu_add_rms_norm"
    check_same_dtype(op, x1=x1, x2=x2)
    if x1.shape != x2.shape:
        raise NPUOpError(f"{op}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ in shape")
    x = x1 + x2
    y, rstd = _rms(op, x, gamma, epsilon)
    return y, rstd, x
