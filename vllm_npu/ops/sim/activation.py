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


def npu_clipped_swiglu(x: torch.Tensor, *, group_index: torch.Tensor | None = None,
                       dim: int = -1, alpha: float = 1.702, limit: float = 7.0,
                       bias: float = 1.0, interleaved: bool = True) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU (torch_npu-npu_clipped_swiglu.md, op-plugin
    op_plugin_functions.yaml `npu_clipped_swiglu`): gate/up are the even/odd features
    (`interleaved`) or the two halves of `dim`; gate <= limit, |up| <= limit;
    out = gate * sigmoid(alpha * gate) * (up + bias), computed in float32."""
    op = "npu_clipped_swiglu"
    check_dtype(op, "x", x)
    if group_index is not None:
        raise NotImplementedError(f"{op}: the simulator does not implement group_index")
    if dim not in (-1, x.dim() - 1) or x.shape[-1] % 2:
        raise NPUOpError(f"{op}: dim {dim} must be the last, of even size, for x "
                         f"{tuple(x.shape)}")
    xf = x.float()
    gate, up = (xf[..., ::2], xf[..., 1::2]) if interleaved else xf.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + bias)).to(x.dtype)
