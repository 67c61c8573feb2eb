"""Gated DeltaNet layers on the NPU op surface (Qwen3-Next, Qwen3.5 linear attention).

vLLM's QwenGatedDeltaNetAttention is a PluggableLayer: this subclass replaces it out of
tree and runs its core (the causal conv1d with its rolling state, then the gated delta
rule) through `vllm_npu.ops` instead of vLLM's Triton / FLA kernels; projections, the
gated RMSNorm and the state bookkeeping stay vLLM's. As vllm-ascend does
(vllm_ascend/ops/gdn.py), q and k are L2-normalised and the decay g / the write
strength beta computed before the delta-rule kernels, which take them as inputs.

Per step: decodes (first in vLLM's batch order) run one conv step and one recurrent
update of their state row; prefills run the varlen conv and the chunked rule from their
state rows (zeros for new requests) and leave their final states there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from vllm_npu import ops

L2_EPS = 1e-6  # fla's l2norm epsilon, as vLLM's kernels use it


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + L2_EPS).to(x.dtype)


@PluggableLayer.register_oot(name="QwenGatedDeltaNetAttention")
class NPUQwenGatedDeltaNetAttention(QwenGatedDeltaNetAttention):

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.num_spec > 0:
            raise NotImplementedError(
                "vllm_npu: Gated DeltaNet layers with speculative decoding "
                f"(num_speculative_tokens={self.num_spec}) are not supported on the NPU; "
                "serve the model without --speculative-config")
        # vLLM's fused / packed variants are CUDA kernels: the core below runs instead
        self.enable_packed_recurrent_decode = False
        self.enable_fused_gdn_spec_decode = False

    def _warmup_prefill_kernels(self, qkv_or_qkvz: torch.Tensor, v_dim: int) -> None:
        """vLLM compiles its Triton / FlashInfer prefill kernels here; nothing to tune."""

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      core_attn_out: torch.Tensor):
        meta = get_forward_context().attn_metadata
        meta = meta.get(self.prefix) if isinstance(meta, dict) else None
        if meta is None:
            return  # profile run
        if getattr(meta, "flashinfer_checkpoint_plan", None) is not None:
            raise NotImplementedError("vllm_npu: Gated DeltaNet prefill checkpoints")
        conv_state = self.kv_cache[0]
        if not is_conv_state_dim_first():  # the conv ops take [rows, D, W-1]
            conv_state = conv_state.transpose(-1, -2)
        ssm_state = self.kv_cache[1]
        n = meta.num_actual_tokens
        rows = meta.non_spec_state_indices_tensor
        weights = self.conv1d.weight.view(self.conv1d.weight.size(0), -1)
        if meta.num_prefills > 0:
            conv = ops.npu_causal_conv1d(mixed_qkv[:n].transpose(0, 1), weights,
                                         self.conv1d.bias, conv_state,
                                         meta.non_spec_query_start_loc, rows,
                                         meta.has_initial_state, self.activation)
            conv = conv.transpose(0, 1)
        else:
            conv = ops.npu_causal_conv1d_update(mixed_qkv[:n], conv_state, weights,
                                                self.conv1d.bias, self.activation, rows[:n])
        query, key, value = (t[0] for t in self.rearrange_mixed_qkv(conv))
        query, key = _l2norm(query), _l2norm(key)
        g = -torch.exp(self.A_log.float()) * F.softplus(a[:n].float() + self.dt_bias.float())
        beta = torch.sigmoid(b[:n].float())
        scale = self.head_k_dim ** -0.5
        out = core_attn_out[:n]
        dec = meta.num_decode_tokens
        if meta.num_decodes > 0:
            out[:dec] = ops.npu_recurrent_gated_delta_rule(
                query[:dec], key[:dec], value[:dec], ssm_state, beta=beta[:dec], scale=scale,
                ssm_state_indices=rows[:dec], g=g[:dec])
        if meta.num_prefills > 0:
            state_rows = meta.prefill_state_indices
            initial = torch.where(meta.prefill_has_initial_state[:, None, None, None],
                                  ssm_state[state_rows], 0)
            lengths = meta.prefill_query_start_loc.diff().tolist()
            prefill_out, finals = ops.npu_chunk_gated_delta_rule(
                query[dec:], key[dec:], value[dec:], beta=beta[dec:], initial_state=initial,
                actual_seq_lengths=lengths, scale=scale, g=g[dec:])
            ssm_state[state_rows] = finals.to(ssm_state.dtype)
            out[dec:] = prefill_out
