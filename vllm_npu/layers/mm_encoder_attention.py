"""Vision encoders' attention (vLLM's MMEncoderAttention, the "mm_encoder_attn" CustomOp)
through `_npu_flash_attention_unpad`, the op vllm-ascend's MMEncoderAttention calls on a
device (packed [T, N, D] tokens, host int32 sequence lengths = diff of cu_seqlens)."""
from __future__ import annotations

import torch
from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

from vllm_npu import ops
from vllm_npu.layers import replaces


def _host_lengths(cu_seqlens, bsz: int, q_len: int) -> torch.Tensor:
    """Each sequence's length on the host, as the op takes them: the rows of the batch
    when no cu_seqlens, else its differences (windows / images packed in one row)."""
    if cu_seqlens is None:
        return torch.full((bsz,), q_len, dtype=torch.int32)
    return torch.diff(torch.as_tensor(cu_seqlens).to("cpu", torch.int64)).to(torch.int32)


@replaces(MMEncoderAttention)
class NPUMMEncoderAttention(MMEncoderAttention):
    def forward_oot(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    cu_seqlens: torch.Tensor | None = None,
                    max_seqlen: torch.Tensor | None = None,
                    sequence_lengths: torch.Tensor | None = None) -> torch.Tensor:
        bsz, q_len = query.shape[:2]
        if key.shape[1] != q_len:
            # queries attending to another sequence (cross attention): not this op's case
            return self.forward_native(query, key, value, cu_seqlens, max_seqlen)
        tokens = bsz * q_len
        q = query.reshape(tokens, self.num_heads, self.head_size).contiguous()
        k = key.reshape(tokens, self.num_kv_heads, self.head_size).contiguous()
        v = value.reshape(tokens, self.num_kv_heads, self.head_size).contiguous()
        out = torch.empty_like(q)
        ops._npu_flash_attention_unpad(q, k, v, _host_lengths(cu_seqlens, bsz, q_len),
                                       self.scale, self.num_heads, self.num_kv_heads, out)
        if query.dim() == 4:
            return out.view(bsz, q_len, self.num_heads, self.head_size)
        return out.view(bsz, q_len, -1)
