"""Simulated `torch_npu.npu_rotary_mul(x, r1, r2, rotary_mode)`: out = x*cos + rot(x)*sin.

`rotary_mode="half"` (NeoX): rot(x) = cat(-x[..., D/2:], x[..., :D/2]).
`rotary_mode="interleave"` (GPT-J): pairs (x0, x1) -> (-x1, x0).
x is 4-D ([B, S, N, D] or [B, N, S, D]); r1/r2 broadcast to it, with full last dim D.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.checks import NPUOpError, check_dim, check_dtype, check_same_dtype


def _rotate(x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                   rotary_mode: str = "half") -> torch.Tensor:
    op = "npu_rotary_mul"
    check_dtype(op, "x", x)
    check_same_dtype(op, x=x, r1=r1, r2=r2)
    check_dim(op, "x", x, 4)
    if rotary_mode not in ("half", "interleave"):
        raise NPUOpError(f"{op}: rotary_mode={rotary_mode!r}; supported: 'half', 'interleave'")
    if x.shape[-1] % 2:
        raise NPUOpError(f"{op}: last dim of x must be even, got {x.shape[-1]}")
    for name, r in (("r1", r1), ("r2", r2)):
        check_dim(op, name, r, 4)
        if r.shape[-1] != x.shape[-1]:
            raise NPUOpError(f"{op}: {name} last dim {r.shape[-1]} != x last dim {x.shape[-1]}")
        # both 4-D: each dim equal to x's or 1 (torch.broadcast_shapes is ~20 us of Python)
        if any(rd != xd and rd != 1 for rd, xd in zip(r.shape, x.shape)):
            raise NPUOpError(f"{op}: {name} {tuple(r.shape)} does not broadcast to x "
                             f"{tuple(x.shape)}")
    done = native.rotary_mul(x, r1, r2, rotary_mode == "interleave")  # float32: one pass
    if done is not None:
        return done
    xf = x.float()
    out = xf * r1.float() + _rotate(xf, rotary_mode) * r2.float()
    return out.to(x.dtype)


def rotary_mul_launch(out: torch.Tensor, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                      rotary_mode: str = "half"):
    """A graph replay's launch into `out` (norm.rms_norm_launch)."""
    prepared = native.rotary_mul_launch(x, r1, r2, rotary_mode == "interleave", out=out)
    return None if prepared is None else prepared[0]
