"""Simulated `torch_npu.npu_swiglu`: silu(first half) * second half along `dim`."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.checks import NPUOpError, check_contiguous, check_dtype


def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    check_dtype("npu_swiglu", "x", x)
    check_contiguous("npu_swiglu", x=x)  # op-plugin npu_swiglu doc: no non-contiguous input
    if x.shape[dim] % 2:
        raise NPUOpError(f"npu_swiglu: dim {dim} of x {tuple(x.shape)} must be even")
    done = native.swiglu(x, dim)  # float32, last dim: one pass
    if done is not None:
        return done
    a, b = x.chunk(2, dim=dim)
    return (F.silu(a.float()) * b.float()).to(x.dtype)


def swiglu_launch(out: torch.Tensor, x: torch.Tensor, dim: int = -1):
    """A graph replay's launch into `out` (norm.rms_norm_launch)."""
    prepared = native.swiglu_launch(x, dim, out=out)
    return None if prepared is None else prepared[0]
