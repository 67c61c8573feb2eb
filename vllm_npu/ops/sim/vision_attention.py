"""`_npu_flash_attention_unpad`: self-attention over packed, unpadded sequences without a KV
cache, as vision encoders run it (torch_npu's binding of ATB's unpadded flash attention).

    query [T, N, D], key / value [T, Nkv, D]   all sequences' tokens concatenated
    seq_len  [B] int32 on the host             each sequence's length (not cumulative)
    out      [T, N, D], preallocated           written in place

Every token attends to every token of its own sequence (no mask: a vision encoder's
attention is bidirectional); grouped heads share their K/V head. What the simulator holds
to, and where it is from:
- seq_len is a host (CPU) int32 tensor of lengths: torch_npu's own test of the op
  (`test_flash_attention_unpad`, run on Ascend910B only; file path not recorded) passes
  `seq_len.cpu()`; vllm-ascend's MMEncoderAttention computes `torch.diff(cu_seqlens)` and
  moves it to the CPU before each call (its notes: the op crashes on a device tensor).
- `out` is allocated by the caller with the query's shape (both callers use
  `torch.empty_like(q)`), and the op writes it.
- fp16 / bf16 on the device; float32 only on the simulator (checks.SIM_FLOAT_DTYPES).
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import (
    NPUOpError,
    check_contiguous,
    check_dim,
    check_dtype,
    check_heads,
    check_same_dtype,
)

OP = "_npu_flash_attention_unpad"


def _check(query, key, value, seq_len, num_heads, num_kv_heads, out) -> None:
    for name, t in (("query", query), ("key", key), ("value", value), ("out", out)):
        check_dtype(OP, name, t)
        check_dim(OP, name, t, 3)
    check_same_dtype(OP, query=query, key=key, value=value, out=out)
    check_contiguous(OP, query=query, key=key, value=value, out=out)
    check_heads(OP, num_heads, num_kv_heads)
    T, N, D = query.shape
    if N != num_heads or key.shape != (T, num_kv_heads, D) or value.shape != key.shape:
        raise NPUOpError(f"{OP}: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                         f"{tuple(value.shape)} do not match num_heads={num_heads}, "
                         f"num_kv_heads={num_kv_heads}")
    if out.shape != query.shape:
        raise NPUOpError(f"{OP}: out {tuple(out.shape)} must have the query's shape "
                         f"{tuple(query.shape)}")
    if seq_len.device.type != "cpu" or seq_len.dtype != torch.int32 or seq_len.dim() != 1:
        raise NPUOpError(f"{OP}: seq_len must be a 1-D int32 host (CPU) tensor of sequence "
                         f"lengths, got {seq_len.dtype} {tuple(seq_len.shape)} on "
                         f"{seq_len.device}")
    if int(seq_len.sum()) != T or bool((seq_len <= 0).any()):
        raise NPUOpError(f"{OP}: seq_len {seq_len.tolist()} must be positive lengths summing "
                         f"to the {T} tokens of query")


def _npu_flash_attention_unpad(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               seq_len: torch.Tensor, scale_value: float, num_heads: int,
                               num_kv_heads: int, out: torch.Tensor) -> torch.Tensor:
    _check(query, key, value, seq_len, num_heads, num_kv_heads, out)
    group = num_heads // num_kv_heads
    start = 0
    for n in seq_len.tolist():
        q = query[start:start + n].transpose(0, 1).float()              # [N, n, D]
        k = key[start:start + n].transpose(0, 1).float().repeat_interleave(group, 0)
        v = value[start:start + n].transpose(0, 1).float().repeat_interleave(group, 0)
        probs = torch.softmax(q @ k.transpose(1, 2) * scale_value, dim=-1)
        out[start:start + n] = (probs @ v).transpose(0, 1).to(out.dtype)
        start += n
    return out
