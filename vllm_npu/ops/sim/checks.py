"""Argument checks shared by the simulated ops: they refuse what the device op refuses."""
from __future__ import annotations

import torch

# Device kernels take fp16/bf16. float32 is a simulation-only extension so that CPU
# parity tests against HF transformers can be exact; the platform refuses float32
# models on a real NPU.
DEVICE_FLOAT_DTYPES = (torch.float16, torch.bfloat16)
SIM_FLOAT_DTYPES = DEVICE_FLOAT_DTYPES + (torch.float32,)


class NPUOpError(ValueError):
    """An argument the real torch_npu op would reject."""


def check_dtype(op: str, name: str, t: torch.Tensor, allowed=SIM_FLOAT_DTYPES) -> None:
    if t.dtype not in allowed:
        raise NPUOpError(f"{op}: {name} has dtype {t.dtype}; supported: {list(allowed)}")


def check_same_dtype(op: str, **tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        raise NPUOpError(f"{op}: inputs must share one dtype, got {dtypes}")


def check_contiguous(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise NPUOpError(f"{op}: {name} must be contiguous (shape {tuple(t.shape)}, "
                             f"stride {t.stride()})")


def check_dim(op: str, name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dim() != ndim:
        raise NPUOpError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")


def check_heads(op: str, num_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise NPUOpError(f"{op}: num_heads={num_heads} must be a positive multiple of "
                         f"num_key_value_heads={num_kv_heads}")
    if num_heads // num_kv_heads > 64:
        raise NPUOpError(f"{op}: num_heads/num_key_value_heads={num_heads // num_kv_heads} "
                         "exceeds the device limit of 64")
