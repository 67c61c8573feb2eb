"""DeepSeek-V3.2's lightning indexer on the NPU op surface: which keys each token attends.

vLLM's `Indexer` (model_executor/models/deepseek_v2.py) owns the weights (wq_b, the fused
wk + weights_proj, k_norm) and a key-cache layer (`DeepseekV32IndexerCache`); its forward
quantises the query to fp8 with a Triton kernel for DeepGEMM. The NPU path follows
vllm-ascend's (vllm_ascend/attention/sfa_v1.py): the query stays in the model dtype, the
key cache holds bf16 / fp16 rows of index_head_dim (128), and the AscendC kernel
`npu_lightning_indexer` scores and picks the top-k keys straight from the paged cache.

    q = wq_b(q_c) [T, H, 128]; k = k_norm(wk(x)) [T, 128]; both roped on their first 64
    dims, NeoX style (HF's DeepseekV32Indexer; vllm-ascend ee2ed573); w = weights_proj(x)
    write   `_npu_reshape_and_cache_siso`: k rows into the indexer cache at the step's slots
    select  `npu_lightning_indexer` (TND / PA_BSND, sparse_mode 3) -> top-k positions per
            token, -1 padded, into the model's shared top-k buffer the sparse MLA reads

The cache write and the selection run inside vLLM's attention custom ops
(`unified_kv_cache_update`, `unified_attention_with_output`, with the indexer-cache layer
as their layer), so a PIECEWISE graph splits at them as at any attention and their
metadata is the cache layer's own (NPUSparseMetadataBuilder: its KV cache group's block
table, which may differ from the MLA layers').
The weights' scale (softmax_scale * H^-0.5) is one positive factor: it does not change a
ranking and is not applied (the device kernel takes none either).
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from vllm.utils.torch_utils import _encode_layer_name
from vllm.v1.attention.backend import AttentionBackend, AttentionLayer, MultipleOf

from vllm_npu import ops
from vllm_npu.attention.sparse_mla import NPUSparseMetadata, NPUSparseMetadataBuilder
from vllm_npu.ops.sim.sparse_attention import LI_HEAD_DIM


class NPUIndexerBackend(AttentionBackend):
    """The indexer key cache: [num_blocks, block_size, 128] rows of the model dtype."""
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]  # float32: simulator

    @staticmethod
    def get_name() -> str:
        return "NPU_DSA_INDEXER"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]  # lightning_indexer_tiling: a multiple of 16 up to 1024

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [LI_HEAD_DIM]

    @staticmethod
    def get_impl_cls() -> type[NPUIndexerImpl]:
        return NPUIndexerImpl

    @staticmethod
    def get_builder_cls() -> type[NPUSparseMetadataBuilder]:
        return NPUSparseMetadataBuilder


def _paged(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache layer's [num_blocks, block_size, D] as the kernels' PA_BSND [.., 1, D]."""
    return kv_cache.view(kv_cache.shape[0], kv_cache.shape[1], 1, kv_cache.shape[-1])


class NPUIndexerImpl:
    """What vLLM's attention custom ops call on the indexer-cache layer."""

    def __init__(self, topk_tokens: int) -> None:
        self.topk_tokens = topk_tokens

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor,
                           value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """key [T, 128] (value: the same tensor, unused) into the step's slots."""
        n = slot_mapping.shape[0]
        ops._npu_reshape_and_cache_siso(key[:n].to(kv_cache.dtype).view(n, 1, -1),
                                        _paged(kv_cache), slot_mapping.to(torch.int32))

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: NPUSparseMetadata | None, output: torch.Tensor,
                **unused) -> None:
        """query [T, H, 128], value = weights [T, H] -> output (the shared top-k buffer
        [max_tokens, topk]) rows [:T] = request-local key positions, -1 padded."""
        if attn_metadata is None:  # profile / dummy run: nothing to select from
            return
        m = attn_metadata
        n = m.num_actual_tokens
        picked, _ = ops.npu_lightning_indexer(
            query[:n].to(kv_cache.dtype).contiguous(), _paged(kv_cache),
            value[:n].contiguous(), actual_seq_lengths_query=m.query_ends,
            actual_seq_lengths_key=m.seq_lens, block_table=m.block_table,
            layout_query="TND", layout_key="PA_BSND", sparse_count=self.topk_tokens,
            sparse_mode=3)
        output[:n].copy_(picked[:, 0])


class NPUIndexer(nn.Module):
    """Stands in for vLLM's Indexer inside the MLA layer (same weights, same call), and
    makes its key cache the NPU's: the cache layer's dtype, head size and backend are
    set on that instance (vLLM builds it for DeepGEMM's fp8 rows + scales)."""

    def __init__(self, indexer: nn.Module, dtype: torch.dtype) -> None:
        if indexer.head_dim != LI_HEAD_DIM:
            raise ValueError(f"NPU lightning indexer: index_head_dim {indexer.head_dim}; the "
                             f"kernel takes {LI_HEAD_DIM}")
        super().__init__()
        self.inner = indexer
        self.topk_tokens = indexer.topk_tokens
        self.topk_indices_buffer = indexer.topk_indices_buffer
        cache = indexer.k_cache
        cache.head_dim, cache.dtype = indexer.head_dim, dtype
        cache.get_attn_backend = lambda: NPUIndexerBackend
        cache.impl = NPUIndexerImpl(indexer.topk_tokens)
        cache.layer_name = cache.prefix
        self.layer_name = cache.prefix

    def forward(self, hidden_states: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor,
                rotary_emb: nn.Module) -> torch.Tensor:
        ix = self.inner
        q = ix.wq_b(qr)[0].view(-1, ix.n_head, ix.head_dim)
        kw = ix.wk_weights_proj(hidden_states)[0]
        k = ix.k_norm(kw[:, :ix.head_dim])
        weights = kw[:, ix.head_dim:]
        q_pe, q_nope = q.split([ix.rope_dim, ix.head_dim - ix.rope_dim], dim=-1)
        k_pe, k_nope = k.split([ix.rope_dim, ix.head_dim - ix.rope_dim], dim=-1)
        q_pe, k_pe = rotary_emb(positions, q_pe, k_pe.unsqueeze(1))
        q = torch.cat([q_pe.reshape(-1, ix.n_head, ix.rope_dim), q_nope], dim=-1)
        k = torch.cat([k_pe.reshape(-1, ix.rope_dim), k_nope], dim=-1)
        name = _encode_layer_name(self.layer_name)
        dep = torch.ops.vllm.unified_kv_cache_update(k, k, name)
        torch.ops.vllm.unified_attention_with_output(
            q, k, weights.to(q.dtype), self.topk_indices_buffer, name, kv_cache_dummy_dep=dep)
        return self.topk_indices_buffer
