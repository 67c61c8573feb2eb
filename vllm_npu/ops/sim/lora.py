"""Simulated multi-LoRA ops: the bgmv (one adapter index per token) and sgmv (one per
request segment) shrink / expand shapes vllm-ascend's punica wrapper calls.

No torch_npu or CANN op exists for them: vllm-ascend ships its own AscendC kernels
(`torch.ops._C_ascend.bgmv_shrink / bgmv_expand / sgmv_shrink / sgmv_expand`,
vllm_ascend/lora/lora_ops.py for the argument order, and falls back to vLLM's torch ops
for ranks >= 128). This plugin takes their argument order on its op surface; on a device
the surface runs vLLM's torch-native implementation (ops/device_ops.py).

    shrink  y[t, :r]            = scale * x[t] @ A[idx[t]]^T        A [L, (1,) r, H]
    expand  y[t, off:off+size] += x[t] @ B[idx[t]]^T                 B [L, (1,) size, r]
    idx[t] = -1: no adapter (shrink writes 0, expand adds nothing)
    sgmv: idx and seq_len per request, the tokens of request b are its seq_len[b] rows.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_dtype


def _weights(op: str, name: str, w: torch.Tensor) -> torch.Tensor:
    if w.dim() == 4:
        if w.shape[1] != 1:
            raise NPUOpError(f"{op}: {name} [L, 1, n, k] needs 1 at dim 1, got {tuple(w.shape)}")
        w = w.squeeze(1)
    if w.dim() != 3:
        raise NPUOpError(f"{op}: {name} must be [L, n, k] or [L, 1, n, k], got {tuple(w.shape)}")
    check_dtype(op, name, w)
    return w


def _indices(op: str, idx: torch.Tensor, rows: int, adapters: int) -> torch.Tensor:
    if idx.dtype != torch.int64 or idx.dim() != 1 or idx.numel() != rows:
        raise NPUOpError(f"{op}: lora indices must be int64 [{rows}], got {idx.dtype} "
                         f"{tuple(idx.shape)}")
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= adapters):
        raise NPUOpError(f"{op}: lora indices must be -1 (none) or in [0, {adapters}), got "
                         f"{idx.unique().tolist()}")
    return idx


def _per_token(op: str, idx: torch.Tensor, seq_len: torch.Tensor, rows: int) -> torch.Tensor:
    if seq_len.dim() != 1 or seq_len.numel() != idx.numel() or int(seq_len.sum()) != rows \
            or (seq_len.numel() and int(seq_len.min()) < 0):
        raise NPUOpError(f"{op}: seq_len {seq_len.tolist()} must give each of the "
                         f"{idx.numel()} requests its rows, {rows} in all")
    return torch.repeat_interleave(idx, seq_len)


def _project(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Row t: x[t] @ w[idx[t]]^T in float32, zero where idx is -1 [T, n]."""
    out = torch.einsum("tk,tnk->tn", x.float(), w[idx.clamp(min=0)].float())
    return out.masked_fill((idx < 0).unsqueeze(1), 0.0)


def npu_bgmv_shrink(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                    y: torch.Tensor, scale: float) -> None:
    op = "npu_bgmv_shrink"
    w = _weights(op, "lora_a", weights)
    check_dtype(op, "x", x)
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != w.shape[2] or y.shape[0] != x.shape[0] \
            or y.shape[1] < w.shape[1]:
        raise NPUOpError(f"{op}: x [T, {w.shape[2]}] and y [T, >= {w.shape[1]}] needed, got "
                         f"{tuple(x.shape)} / {tuple(y.shape)}")
    idx = _indices(op, indices, x.shape[0], w.shape[0])
    y[:, :w.shape[1]] = (scale * _project(x, w, idx)).to(y.dtype)


def npu_bgmv_expand(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                    y: torch.Tensor, slice_offset: int, slice_size: int) -> None:
    op = "npu_bgmv_expand"
    w = _weights(op, "lora_b", weights)
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != w.shape[2] or y.shape[0] != x.shape[0]:
        raise NPUOpError(f"{op}: x [T, {w.shape[2]}] and y [T, n] needed, got "
                         f"{tuple(x.shape)} / {tuple(y.shape)}")
    if slice_size != w.shape[1] or slice_offset < 0 or slice_offset + slice_size > y.shape[1]:
        raise NPUOpError(f"{op}: slice [{slice_offset}, {slice_offset + slice_size}) must be "
                         f"lora_b's {w.shape[1]} rows inside y's {y.shape[1]} columns")
    idx = _indices(op, indices, x.shape[0], w.shape[0])
    part = y[:, slice_offset:slice_offset + slice_size]
    part += _project(x, w, idx).to(y.dtype)


def npu_sgmv_shrink(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                    seq_len: torch.Tensor, y: torch.Tensor, scale: float) -> None:
    token_idx = _per_token("npu_sgmv_shrink", indices, seq_len, x.shape[0])
    npu_bgmv_shrink(x, weights, token_idx, y, scale)


def npu_sgmv_expand(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                    seq_len: torch.Tensor, y: torch.Tensor, slice_offset: int,
                    slice_size: int) -> None:
    token_idx = _per_token("npu_sgmv_expand", indices, seq_len, x.shape[0])
    npu_bgmv_expand(x, weights, token_idx, y, slice_offset, slice_size)
