"""Mamba-2 mixers on the NPU op surface (Granite 4.0-H, Falcon-H1, Nemotron-H, Bamba).

vLLM's MambaMixer2 is a PluggableLayer: this subclass replaces it out of tree and runs the
conv / SSD leaves through `vllm_npu.ops` (ops/sim/mamba.py on the simulated NPU) instead
of vLLM's Triton kernels. Projections, the gated RMSNorm and the state bookkeeping
(metadata, state-pool indices, prefix-cache alignment copies) stay vLLM's.

Per step, prefill requests (after the decodes in vLLM's batch order) run the varlen conv
and the chunked SSD scan from their states (zeros for new requests), decodes run one
conv step and one selective-state update; every request leaves its state in its pool row.
"""
from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from vllm_npu import ops


@PluggableLayer.register_oot(name="MambaMixer2")
class NPUMambaMixer2(MambaMixer2):

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.use_replayssm or self.num_spec > 0:
            raise NotImplementedError(
                "vllm_npu: Mamba-2 layers with speculative decoding (ReplaySSM / "
                f"num_speculative_tokens={self.num_spec}) are not supported on the NPU; "
                "serve the model without --speculative-config")

    def _warmup_ssd_kernels(self, projected_states: torch.Tensor) -> None:
        """vLLM warms its Triton autotuner here; the NPU kernels have nothing to tune."""

    def _states(self) -> tuple[torch.Tensor, torch.Tensor]:
        conv = self.kv_cache[0]
        # the conv kernels take [pool, D, W-1]; the state-first layout is its transpose
        return (conv if is_conv_state_dim_first() else conv.transpose(-1, -2)), self.kv_cache[1]

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor):
        meta = get_forward_context().attn_metadata
        meta = meta.get(self.prefix) if isinstance(meta, dict) else None
        if meta is None:  # profile run: vLLM's own path (no kernels with no metadata)
            return super().conv_ssm_forward(projected_states, output)
        if meta.checkpoint_chunk_idx is not None:
            raise NotImplementedError("vllm_npu: Mamba-2 shared-prefix checkpoints "
                                      "(--enable-mamba-shared-prefix-checkpoint)")
        xbc, dt = torch.split(projected_states[..., self.tped_intermediate_size:],
                              [self.tped_conv_size, self.tped_dt_size], dim=-1)
        conv_state, ssm_state = self._states()
        n_dec, n_pre = meta.num_decode_tokens, meta.num_prefill_tokens
        xbc_d, xbc_p = torch.split(xbc[:n_dec + n_pre], [n_dec, n_pre])
        dt_d, dt_p = torch.split(dt[:n_dec + n_pre], [n_dec, n_pre])
        out_d, out_p = torch.split(output[:n_dec + n_pre], [n_dec, n_pre])
        heads = self.num_heads // self.tp_size
        groups = self.n_groups // self.tp_size
        bias = self.conv1d.bias
        if meta.num_prefills > 0:
            rows = meta.state_indices_tensor_p
            conv = ops.npu_causal_conv1d(
                xbc_p.transpose(0, 1), self.conv_weights, bias, conv_state,
                meta.query_start_loc_p, rows, meta.has_initial_states_p,
                self.activation).transpose(0, 1)
            x, b, c = self.split_hidden_states_B_C_fn(conv)
            starts = None
            if meta.has_initial_states_p is not None and meta.prep_initial_states:
                starts = torch.where(meta.has_initial_states_p[:, None, None, None],
                                     ssm_state[rows], 0)
            finals = ops.npu_mamba_chunk_scan(
                x.reshape(n_pre, heads, self.head_dim), dt_p, self.A,
                b.reshape(n_pre, groups, -1), c.reshape(n_pre, groups, -1),
                meta.chunk_size, self.D, self.dt_bias, meta.query_start_loc_p, starts, True,
                out_p.view(n_pre, heads, self.head_dim))
            ssm_state[rows] = finals.to(ssm_state.dtype)
        if meta.num_decodes > 0:
            rows = meta.state_indices_tensor_d
            if rows.dim() == 2:  # [decodes, 1 + speculative tokens]: no speculation here
                rows = rows[:, 0]
            conv = ops.npu_causal_conv1d_update(xbc_d, conv_state, self.conv_weights, bias,
                                                self.activation, rows)
            x, b, c = self.split_hidden_states_B_C_fn(conv)
            ops.npu_selective_state_update(
                ssm_state, x.reshape(n_dec, heads, self.head_dim), dt_d, self.A,
                b.reshape(n_dec, groups, -1), c.reshape(n_dec, groups, -1), self.D,
                self.dt_bias, True, rows, out_d.view(n_dec, heads, self.head_dim))
