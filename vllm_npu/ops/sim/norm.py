"""Simulated `torch_npu.npu_rms_norm` / `npu_add_rms_norm`: statistics in float32."""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.checks import NPUOpError, check_dtype, check_same_dtype


def _check(op: str, x: torch.Tensor, gamma: torch.Tensor) -> None:
    check_dtype(op, "x", x)
    check_same_dtype(op, x=x, gamma=gamma)
    if gamma.shape != x.shape[-gamma.dim():]:
        raise NPUOpError(f"{op}: gamma shape {tuple(gamma.shape)} must match the trailing "
                         f"dims of x {tuple(x.shape)}")


def _rms(op: str, x: torch.Tensor, gamma: torch.Tensor, epsilon: float):
    _check(op, x, gamma)
    if x.dtype == torch.float32:
        # one pass instead of six ops (native.py; within an ulp or two of the formula
        # below), else aten's _fused_rms_norm (bitwise the formula); not for bf16/fp16,
        # where the formula rounds (x * rstd) to the input dtype before the weight multiply
        done = native.rms_norm(x, None, gamma, epsilon)
        if done is not None:
            return done[:2]
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
    _check(op, x1, gamma)
    done = native.rms_norm(x1, x2, gamma, epsilon)  # float32: the add in the same pass
    if done is not None:
        return done
    x = x1 + x2
    y, rstd = _rms(op, x, gamma, epsilon)
    return y, rstd, x


# A graph replay's launch into the captured outputs (graph.graph_op `replay_launch`),
# prepared at capture from the captured (checked) arguments. None: not covered, the
# replay runs the op and copies its results in.
def rms_norm_launch(outputs: tuple, x: torch.Tensor, gamma: torch.Tensor,
                    epsilon: float = 1e-6) -> native.Launch | None:
    prepared = native.rms_norm_launch(x, None, gamma, epsilon, out=outputs)
    return None if prepared is None else prepared[0]


def add_rms_norm_launch(outputs: tuple, x1: torch.Tensor, x2: torch.Tensor,
                        gamma: torch.Tensor, epsilon: float = 1e-6) -> native.Launch | None:
    prepared = native.rms_norm_launch(x1, x2, gamma, epsilon, out=outputs)
    return None if prepared is None else prepared[0]
