"""Rotary embedding through `npu_rotary_mul`.

vLLM hands flattened heads, query [T, N*D] / key [T, Hkv*D], and positions [T]. The
cos/sin rows for those positions are gathered from `cos_sin_cache` ([max_pos, rot] as
cos | sin halves), widened to the full rotary dim in the layout the op's rotary_mode
expects, and applied to the first `rotary_dim` features of every head (BSND with B=1).
"""
from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

from vllm_npu import ops
from vllm_npu.layers import replaces


@replaces(RotaryEmbedding)
class NPURotaryEmbedding(RotaryEmbedding):
    # vLLM's get_rope shares one instance between the layers of a model, so the rows for
    # a forward's positions are gathered once, by the first layer, and reused by the rest
    # (within one forward context: a captured graph then holds one gather, not one per
    # layer; vllm-ascend computes them once per step too, into module-level _cos/_sin,
    # in ops/rotary_embedding.py update_cos_sin)
    _memo: tuple | None = None

    def _cos_sin(self, positions: torch.Tensor, like: torch.Tensor):
        if torch.compiler.is_compiling():  # traced: per layer (no Python memo in a graph)
            return self._gather_cos_sin(positions, like)
        ctx = get_forward_context() if is_forward_context_available() else None
        memo = self._memo
        if ctx is not None and memo is not None and memo[0] is ctx \
                and memo[1] is positions and memo[2] == like.dtype:
            return memo[3]
        cos_sin = self._gather_cos_sin(positions, like)
        # holds the context and positions only until the next forward replaces them
        self._memo = (ctx, positions, like.dtype, cos_sin) if ctx is not None else None
        return cos_sin

    def _gather_cos_sin(self, positions: torch.Tensor, like: torch.Tensor):
        cache = self._match_cos_sin_cache_dtype(like)
        cos, sin = cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
        if self.is_neox_style:
            cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        else:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        return cos[None, :, None, :], sin[None, :, None, :]

    def _apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(1, cos.shape[1], -1, self.head_size)
        mode = "half" if self.is_neox_style else "interleave"
        # x is a view of the fused qkv rows: the op reads it in place (no copy), as
        # aclnnRotaryPositionEmbedding takes non-contiguous x (aclnn_rotary_position_embedding.h)
        if self.rotary_dim == self.head_size:
            out = ops.npu_rotary_mul(x, cos, sin, mode)
        else:
            rot = ops.npu_rotary_mul(x[..., :self.rotary_dim], cos, sin, mode)
            out = torch.cat((rot, x[..., self.rotary_dim:]), dim=-1)
        return out.reshape(shape)

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor,
                    key: torch.Tensor | None = None):
        cos, sin = self._cos_sin(positions, query)
        query = self._apply(query, cos, sin)
        if key is not None:
            key = self._apply(key, cos, sin)
        return query, key
