"""Multi-LoRA on the NPU: vLLM's punica wrapper interface over the op surface's bgmv /
sgmv shrink and expand (ops/sim/lora.py; vllm-ascend's kernel shapes).

vLLM's `PunicaWrapperCPU` already holds the batch's adapter bookkeeping (token -> adapter
index buffers that `update_metadata` refreshes in place each step, prefill segments) and
routes every LoRA layer to six primitives; this wrapper keeps that and replaces the six.
Decode batches use bgmv, reading the persistent per-token index buffer, so captured FULL
decode graphs see each step's adapters; prefill (sgmv, host segment lengths) runs eagerly.

Expand always adds into its output slice, as vllm-ascend's kernel does: vLLM's one
non-adding call (`add_inputs=False`, BaseLinearLayerWithLoRA's parallel path) passes a
zeroed output, where adding and writing agree.
"""
from __future__ import annotations

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from vllm_npu import ops


class NPUPunicaWrapper(PunicaWrapperCPU):

    def _segments(self) -> tuple[torch.Tensor, torch.Tensor]:
        _, seq_len, indices, *_ = self.prefill_metadata  # (starts, lens, ids, b, max, T)
        return indices.to(torch.int64), seq_len

    def _shrink_prefill(self, y, x, w_t_all, scale):
        if self.no_lora:
            return
        indices, seq_len = self._segments()
        ops.npu_sgmv_shrink(x, w_t_all, indices, seq_len, y, scale)

    def _shrink_decode(self, y, x, w_t_all, scale):
        ops.npu_bgmv_shrink(x, w_t_all, self.token_lora_indices, y, scale)

    def _expand_prefill(self, y, x, w_t_all, add_inputs):
        self._expand_slice_prefill(y, x, w_t_all, 0, y.shape[1], add_inputs)

    def _expand_decode(self, y, x, w_t_all, add_inputs):
        self._expand_slice_decode(y, x, w_t_all, 0, y.shape[1], add_inputs)

    def _expand_slice_prefill(self, y, x, w_t_all, y_offset, y_slice_size, add_inputs):
        if self.no_lora:
            return
        indices, seq_len = self._segments()
        ops.npu_sgmv_expand(x, w_t_all, indices, seq_len, y, y_offset, y_slice_size)

    def _expand_slice_decode(self, y, x, w_t_all, y_offset, y_slice_size, add_inputs):
        ops.npu_bgmv_expand(x, w_t_all, self.token_lora_indices, y, y_offset, y_slice_size)
