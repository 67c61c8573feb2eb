"""MLA prefill on the NPU: dense causal attention over expanded K/V with one
`npu_fused_infer_attention_score` call in TND layout (vLLM's `MLAPrefillBackend` contract).

    q [Tq, N, P+R]   k [Tkv, N, P+R]   v [Tkv, N, V]      (P nope, R rope, V value dims)
    actual_seq_lengths     = cumulative query ends   (host list)
    actual_seq_lengths_kv  = cumulative kv ends      (host list)

Each request's kv rows are its cached context followed by its new tokens, so right-down
causal masking (sparse_mode 3) lets query row i of a request with q new and kv total
tokens see kv rows j <= kv - q + i: the whole context plus the causal part of the new
tokens. One call covers fresh prefills, chunked prefills and prefix-cache hits.

The dense TND form takes head dims (128, 128, 128) or (192, 192, 128 / 192) in bfloat16:
DeepSeek-V2/V3's real shapes (Q/K 192, V 128) run as they are, others zero-padded, and
float16 runs in bfloat16 (dense_tnd.py).
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, ClassVar

import torch
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

from vllm_npu import ops
from vllm_npu.attention import dense_tnd

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention.mla_attention import (
        MLACommonPrefillMetadata,
    )

MASK_SIDE = 2048  # the fused op's compressed causal mask is always 2048 x 2048


def cumulative(lengths) -> list[int]:
    return list(itertools.accumulate(int(n) for n in lengths))


class NPUMLAPrefillBackend(MLAPrefillBackend):
    # float32 runs on the simulated NPU only; the platform refuses it on a device.
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]

    @staticmethod
    def get_name() -> str:
        return "NPU_FIA"

    def _mask(self, device: torch.device) -> torch.Tensor:
        mask = getattr(self, "_attn_mask", None)
        if mask is None or mask.device != device:
            mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool, device=device).triu_(1)
            self._attn_mask = mask
        return mask

    def run_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_ends: list[int], kv_ends: list[int], causal: bool = True,
                    return_lse: bool = False):
        """Ragged attention; returns out [Tq, N, V] (and lse [N, Tq] float32)."""
        n, v_dim, dtype = q.shape[1], v.shape[2], q.dtype
        q, k, v = dense_tnd.prepare(q, k, v)
        mask = dict(sparse_mode=3, atten_mask=self._mask(q.device)) if causal else {}
        out, lse = ops.npu_fused_infer_attention_score(
            q, k, v, actual_seq_lengths=q_ends, actual_seq_lengths_kv=kv_ends,
            num_heads=n, num_key_value_heads=n, scale=float(self.scale),
            input_layout="TND", softmax_lse_flag=return_lse, **mask)
        out = out[..., :v_dim].to(dtype)
        if not return_lse:
            return out
        return out, lse[..., 0].transpose(0, 1)  # [T, N, 1] -> vLLM's [N, T]

    # ---- vLLM's MLAPrefillBackend contract ---------------------------------------
    def run_prefill_new_tokens(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               return_softmax_lse: bool, out: torch.Tensor | None = None,
                               output_scale: torch.Tensor | None = None):
        if output_scale is not None:
            raise NotImplementedError("NPU MLA prefill: fused output quantization")
        ends = cumulative(self._prefill_metadata.query_lens_cpu.tolist())
        result = self.run_prefill(q, k, v, ends, ends, causal=True,
                                  return_lse=return_softmax_lse)
        if out is not None and not return_softmax_lse:
            out.copy_(result)
            return out
        return result

    def run_prefill_context_chunk(self, chunk: MLACommonPrefillMetadata.ContextChunk,
                                  q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  out: torch.Tensor | None = None):
        if out is not None:
            raise NotImplementedError("NPU MLA prefill: in-place context output")
        q_lens = self._prefill_metadata.query_lens_cpu[chunk.request_slice].tolist()
        # The context precedes every query token of its request: no mask.
        return self.run_prefill(q, k, v, cumulative(q_lens), cumulative(chunk.seq_lens.tolist()),
                                causal=False, return_lse=True)
