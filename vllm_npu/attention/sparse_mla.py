"""DeepSeek-V3.2 sparse MLA on the NPU op surface (also GLM-5's `GlmMoeDsaForCausalLM`).

Every token of a batch (prefill and decode alike) attends only the keys its lightning
indexer picked (dsa_indexer.py writes them, request-local positions padded with -1, into
the model's shared top-k buffer before the layer runs). As vllm-ascend does on A2/A3
(vllm_ascend/attention/sfa_v1.py), the whole batch is one call of
`npu_sparse_flash_attention` with the absorbed query [q_nope @ W_UK | q_pe] against the
latent cache's two planes (kv_layout.latent_planes; written like dense MLA's), TND with
cumulative query ends, per-request key lengths and the block table. vLLM's MLA layer
absorbs W_UK before and applies W_UV after (`forward_mqa`); the metadata routes every token
there (num_decode_tokens = all tokens), so there is no dense-MHA prefill.

    tokens  | req0: q0 q1 q2 (prefill) | req1: q (decode) | ...  one TND call, mode 3
    keys    | each row: its indexer's top-k positions < S2 - S1 + r + 1, then -1

Graphs: none yet (the builder reports NEVER, so vLLM narrows FULL_AND_PIECEWISE to
PIECEWISE and FULL_DECODE_ONLY to eager, with a log line). The indexer and the attention
run at graph splits (vLLM's attention custom ops) in PIECEWISE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention.sparse_mla_attention import SharedTopkIndicesBuffer
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from vllm_npu import ops
from vllm_npu.attention.mla import NPUMLABackend, NPUMLAImpl, padded_heads
from vllm_npu.kv_layout import latent_planes
from vllm_npu.ops.sim.sparse_attention import SFA_GROUPS


@dataclass
class NPUSparseMetadata(AttentionMetadata):
    """One step's batch as the sparse ops take it (the sparse MLA layers' and the
    indexer caches' metadata alike): device int32 tensors, requests in vLLM's order."""
    num_reqs: int
    num_actual_tokens: int
    query_ends: torch.Tensor   # [num_reqs] cumulative query tokens (TND)
    seq_lens: torch.Tensor     # [num_reqs] key length per request (cached + new)
    block_table: torch.Tensor  # [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # [num_actual_tokens]
    # vLLM's MLA layer splits tokens by these: every token takes the top-k MQA path
    num_decodes: int = 0
    num_decode_tokens: int = 0
    num_prefills: int = 0
    prefill: None = None
    decode: None = None


class NPUSparseMetadataBuilder(AttentionMetadataBuilder[NPUSparseMetadata]):

    @classmethod
    def get_cudagraph_support(cls, vllm_config: VllmConfig,
                              kv_cache_spec: AttentionSpec) -> AttentionCGSupport:
        """No FULL graphs yet: the indexer's top-k and the sparse attention would be graph
        tasks re-issued per replay with the step's lengths and block tables (the update
        path dense MLA has, update_graph_params); until they are, vLLM runs these models
        in PIECEWISE (FULL_AND_PIECEWISE) or eagerly (FULL_DECODE_ONLY) and logs it."""
        return AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device):
        # abstract in vLLM's base: every builder defines it, this one needs nothing more
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NPUSparseMetadata:
        cm = common_attn_metadata
        n = cm.num_reqs
        return NPUSparseMetadata(
            num_reqs=n, num_actual_tokens=cm.num_actual_tokens,
            query_ends=cm.query_start_loc[1:n + 1].to(torch.int32),
            seq_lens=cm.seq_lens[:n].to(torch.int32),
            block_table=cm.block_table_tensor[:n].to(torch.int32),
            slot_mapping=cm.slot_mapping[:cm.num_actual_tokens],
            num_decodes=n, num_decode_tokens=cm.num_actual_tokens)


class NPUSparseMLABackend(NPUMLABackend):
    """Dense MLA's cache layout and limits (latent 512 + rope 64, block 128), sparse
    attention over the indexer's picks."""

    @staticmethod
    def get_name() -> str:
        return "NPU_MLA_SPARSE"

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @staticmethod
    def get_metadata_cls() -> type[NPUSparseMetadata]:
        return NPUSparseMetadata

    @staticmethod
    def get_impl_cls() -> type[NPUSparseMLAImpl]:
        return NPUSparseMLAImpl

    @staticmethod
    def get_builder_cls() -> type[NPUSparseMetadataBuilder]:
        return NPUSparseMetadataBuilder


class NPUSparseMLAImpl(NPUMLAImpl, SharedTopkIndicesBuffer):
    is_sparse = True
    supports_dense_mha_prefill = False
    can_return_lse_for_decode = False
    supports_dcp = False
    supports_pcp = False

    def __init__(self, *args, topk_indices_buffer: torch.Tensor | None = None,
                 indexer=None, **mla_args) -> None:
        mla_args.pop("index_group_builder", None)  # no index groups: see below
        super().__init__(*args, **mla_args)
        if self.dcp_world_size > 1 or self.pcp_world_size > 1:
            raise NotImplementedError("NPU sparse MLA (DeepSeek-V3.2): decode / prefill "
                                      "context parallelism is not supported")
        self.init_topk_indices_buffer(indexer, topk_indices_buffer)
        self.sfa_heads = padded_heads(self.num_heads, SFA_GROUPS)

    def record_logical_topk_ready(self) -> None:
        """The indexer's picks are request-local positions, which the kernel takes as they
        are: nothing to convert (vLLM's index groups translate them to slots for CUDA)."""

    def forward_mha(self, *args, **kwargs) -> None:
        raise AssertionError("NPU sparse MLA routes every token through forward_mqa")

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: NPUSparseMetadata,
                    layer: AttentionLayer) -> tuple[torch.Tensor, None]:
        """q = (ql_nope [T, N, L], q_pe [T, N, R]) -> latent output [T, N, L]."""
        q_nope, q_rope = q if isinstance(q, tuple) else q.split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        tokens, heads = q_nope.shape[:2]
        act_dtype, cache_dtype = q_nope.dtype, kv_c_and_k_pe_cache.dtype
        pad = (0, 0, 0, self.sfa_heads - heads)
        q_nope = F.pad(q_nope.to(cache_dtype), pad).contiguous()
        q_rope = F.pad(q_rope.to(cache_dtype), pad).contiguous()
        nope, rope = latent_planes(kv_c_and_k_pe_cache, self.kv_lora_rank)
        m = attn_metadata
        indices = self.topk_indices_buffer[:tokens].view(tokens, 1, -1)
        out, _, _ = ops.npu_sparse_flash_attention(
            q_nope, nope, nope, indices, self.scale, block_table=m.block_table,
            actual_seq_lengths_query=m.query_ends, actual_seq_lengths_kv=m.seq_lens,
            query_rope=q_rope, key_rope=rope, sparse_block_size=1, layout_query="TND",
            layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
        return out[:, :heads].to(act_dtype), None
