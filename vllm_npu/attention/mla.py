"""MLA (DeepSeek-V2/V3 multi-head latent attention) on the NPU op surface.

vLLM's `MLAAttention` layer owns the MLA math around the backend: it writes the latent
cache through `impl.do_kv_cache_update`, runs prefill tokens through `impl.forward_mha`
and decode tokens through `impl.forward_mqa` with the weights already absorbed (W_UK
into the query before, W_UV after). This module only supplies the device leaves.

Latent KV cache of one layer: vLLM sizes it as one "head" of L + R per token, and this
backend lays that memory out as two planes (`kv_layout.latent_planes`):

    kv_cache memory  | nope [num_blocks, block_size, 1, L] | rope [num_blocks, block_size, 1, R] |
                     L = kv_lora_rank, R = qk_rope_head_dim;  slot s -> (s // bs, s % bs) in both

  write    `_npu_reshape_and_cache`: kv_c_normed [T, 1, L] into nope, k_pe [T, 1, R] into rope
  decode   `npu_multi_head_latent_attention`: q_nope @ W_UK [B, N, L] and q_pe [B, N, R]
           against both planes (keys: all L+R features, values: nope) -> [B, N, L]
  prefill  per request, kv rows = [cached context | new tokens] as latents, expanded through
           kv_b_proj to K = [k_nope | k_pe] and V; one fused-attention call, right-down causal
           (`NPUMLAPrefillBackend.run_prefill`)

Graphs: FULL for pure-decode batches (UNIFORM_SINGLE_TOKEN_DECODE). The captured forward
holds vLLM's absorption matmuls and two tasks per layer (latent write, decode attention);
`update_graph_params` re-issues both for each replayed batch.

Decode context parallelism (DCP of world W): the latent rows are sharded by position like
the standard backend's K/V (`context_parallel`). vLLM's MLA layer all-gathers the absorbed
queries of the W ranks' heads before `forward_mqa` and merges the ranks' results by lse
after it (its correction kernel is `context_parallel.correct_attn_cp_out` here), so decode
attends this rank's shard with `npu_multi_head_latent_attention` (lse returned). Prefill
all-gathers each request's cached context latents (`gather_sharded_rows`) and then runs as
without DCP.

Batches are reordered by vLLM so that decodes (one query token) come first:

    tokens  | d0 d1 ... d_{D-1} | p0 p0 p0 | p1 p1 | ...
            |<- forward_mqa  ->|<------ forward_mha ------>|
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    MLACommonPrefillMetadata,
    QueryLenSupport,
)
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens
from vllm.v1.kv_cache_interface import AttentionSpec

from vllm_npu import ops
from vllm_npu.attention import mla_spec_decode as spec
from vllm_npu.attention.backend import MASK_SIDE, uses_dcp
from vllm_npu.attention.fia_calls import as_task, fia_max_workspace, fia_out
from vllm_npu.attention.context_parallel import gather_sharded_rows
from vllm_npu.attention.mla_prefill import cumulative
from vllm_npu.attention.host_lens import host_seq_lens
from vllm_npu.attention.prefill_context_parallel import (
    PCPMetadata,
    build_pcp_metadata,
    local_common_metadata,
)
from vllm_npu.compilation.graph_backend import get_graph_backend
from vllm_npu.compilation.graph_params import GRAPH_PARAMS
from vllm_npu.kv_layout import latent_planes
from vllm_npu.ops.sim.fia_shapes import (
    ATB_MLA_BLOCK,
    ATB_MLA_HEADS,
    ATB_MLA_LATENT,
    ATB_MLA_ROPE,
)

MLA_BLOCK_SIZE = ATB_MLA_BLOCK  # ATB's MLA decode: block_size 128


def padded_heads(num_heads: int, choices: tuple[int, ...] = ATB_MLA_HEADS) -> int:
    """The query heads the MLA decode ops run: ATB MLA takes {8, 16, 32, 64, 128}, the fused
    op's MLA form powers of two up to 128 (sparse attention's `choices` likewise); other
    counts are padded with zero queries whose outputs are dropped (vllm-ascend pads to the
    next power of two, mla_v1.py)."""
    for heads in choices:
        if num_heads <= heads:
            return heads
    raise ValueError(f"NPU MLA: {num_heads} query heads per rank; the MLA kernels take at "
                     f"most {choices[-1]} (raise the tensor-parallel size)")


def _pad_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, N, D] -> [B, heads, D], zero query heads appended."""
    extra = heads - t.shape[1]
    return (F.pad(t, (0, 0, 0, extra)) if extra else t).contiguous()


class NPUMLABackend(MLACommonBackend):
    # float32 is accepted for the simulated NPU only; the platform refuses it on a device.
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "NPU_MLA"

    @classmethod
    def full_path(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MLA_BLOCK_SIZE]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [ATB_MLA_LATENT + ATB_MLA_ROPE]  # the MLA kernels' latent + rope: 512 + 64

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type[NPUMLAImpl]:
        return NPUMLAImpl

    @staticmethod
    def get_builder_cls() -> type[NPUMLAMetadataBuilder]:
        return NPUMLAMetadataBuilder


@dataclass
class NPUMLAPrefillMetadata(MLACommonPrefillMetadata):
    query_lens: list[int] = field(default_factory=list)    # host, [num_prefills] new tokens
    context_lens: list[int] = field(default_factory=list)  # host, [num_prefills] cached before


@dataclass
class NPUMLADecodeMetadata(MLACommonDecodeMetadata):
    """block_table int32 [num_decodes, max_blocks]; seq_lens host int32 [num_decodes];
    with several query tokens per request (drafts to verify) their host cumulative ends
    and the fused op's compressed causal mask (mla_spec_decode)."""
    query_ends: list[int] | None = None
    attn_mask: torch.Tensor | None = None


@dataclass
class NPUMLAMetadata(MLACommonMetadata[NPUMLADecodeMetadata]):
    pcp: PCPMetadata | None = None  # PCP: this rank's pieces, which the fields above describe

    def __post_init__(self):
        # vLLM's check allows only the CUDA kernels' latent widths (320/512/576).
        if self.head_dim is not None and not NPUMLABackend.supports_head_size(self.head_dim):
            raise ValueError(f"NPU MLA: latent head size {self.head_dim} is not supported")


@dataclass(frozen=True, slots=True)
class MLAUpdateArgs:
    """One layer's graph-update arguments (NPUMLAImpl.graph_update_args)."""
    table: torch.Tensor         # int32 [batch, max_blocks], padded with null-block rows
    seq_lens: list[int]         # host, padded with 0 (or with the drafts' padding requests)
    slots: torch.Tensor | None  # int32 cache-write slots (None: shared KV layer)
    query_ends: list[int] | None = None  # drafts to verify: host cumulative query ends


@dataclass(frozen=True, slots=True)
class MLATasks:
    """One MLA layer's tasks in one captured decode graph, with the buffers they read."""
    cache_write: Any            # task handle: _npu_reshape_and_cache (None: shared KV)
    attention: Any              # task handle: the decode attention call
    nope_rows: torch.Tensor | None  # [T, 1, L] new latent rows, captured ...
    rope_rows: torch.Tensor | None  # [T, 1, R] ... and their rotary part
    q_nope: torch.Tensor        # [B, N, L] absorbed decode queries, captured ...
    q_rope: torch.Tensor        # [B, N, R]
    kv_cache: torch.Tensor      # the layer's cache memory (latent_planes)
    output: torch.Tensor        # [B, N, L] where the graph reads the result
    query_len: int = 1          # > 1: the fused op's multi-token form (mla_spec_decode) ...
    workspace: torch.Tensor | None = None  # ... with its workspace and lse buffer
    lse: torch.Tensor | None = None


class NPUMLAMetadataBuilder(MLACommonMetadataBuilder[NPUMLAMetadata]):
    """vLLM's MLA builder (decode/prefill split, block tables), plus the host-side lengths
    the NPU ops take as arguments."""

    @classmethod
    def get_cudagraph_support(cls, vllm_config: VllmConfig,
                              kv_cache_spec: AttentionSpec) -> AttentionCGSupport:
        """FULL graphs for pure-decode batches only: vLLM's MLA layer splits a batch into
        decode and prefill tokens on the host, so a captured forward keeps the capture's
        split; NPUMLAImpl.update_graph_params refreshes the decode tasks. With
        speculative decoding, uniform batches of 1 + k tokens per request. None with DCP
        (its collectives and lse path have no update hook)."""
        if uses_dcp(vllm_config):
            return AttentionCGSupport.NEVER
        if vllm_config.speculative_config is not None:
            return AttentionCGSupport.UNIFORM_BATCH
        return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    # Decode rounds may carry drafts (1 + k tokens per request, k <= 15; mla_spec_decode).
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.VARLEN

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device,
                         metadata_cls=NPUMLAMetadata)
        self.speculative = vllm_config.speculative_config is not None
        self.spec_mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool,
                                    device=device).triu_(1) if self.speculative else None

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NPUMLAMetadata:
        cm = common_attn_metadata
        world = self.vllm_config.parallel_config.prefill_context_parallel_size
        if world == 1:
            return self._build(common_prefix_len, cm, fast_build)
        # PCP: the metadata of this rank's pieces; vLLM's MLA layer splits them into
        # decodes and prefills and gathers every rank's new latents for the cache write.
        from vllm.distributed.parallel_state import get_pcp_group

        seq_lens = host_seq_lens(cm, cm.num_reqs, self.speculative)
        pcp = build_pcp_metadata(cm.query_start_loc_cpu[:cm.num_reqs + 1].tolist(),
                                 seq_lens.tolist(), cm.num_actual_tokens, world,
                                 get_pcp_group().rank_in_group)
        meta = self._build(common_prefix_len, local_common_metadata(cm, pcp), fast_build)
        meta.pcp = pcp
        return meta

    def _build(self, common_prefix_len: int, cm: CommonAttentionMetadata,
               fast_build: bool) -> NPUMLAMetadata:
        meta = super().build(common_prefix_len, cm, fast_build)
        seq_lens_cpu = host_seq_lens(cm, cm.num_reqs, self.speculative)
        nd = meta.num_decodes
        if meta.decode is not None:
            decode_lens = seq_lens_cpu[:nd]
            if self.dcp_world_size > 1:  # decode attends this rank's shard of each request
                from vllm.distributed import get_dcp_group

                decode_lens = get_dcp_local_seq_lens(decode_lens, self.dcp_world_size,
                                                     get_dcp_group().rank_in_group,
                                                     self.cp_kv_cache_interleave_size)
            meta.decode = NPUMLADecodeMetadata(
                block_table=meta.decode.block_table.to(torch.int32),
                # A host-side argument: its own copy (a view of the runner's persistent
                # buffer would change under a captured task, which the device never sees).
                seq_lens=decode_lens.to(torch.int32).clone(),
                dcp_tot_seq_lens=seq_lens_cpu[:nd] if self.dcp_world_size > 1 else None,
                query_ends=spec.query_ends_if_multi_token(cm.query_start_loc_cpu, nd),
                attn_mask=self.spec_mask)
        if meta.prefill is not None:
            p = meta.prefill
            q_lens = p.query_lens_cpu.to(torch.int32)
            meta.prefill = NPUMLAPrefillMetadata(
                **{f.name: getattr(p, f.name) for f in fields(MLACommonPrefillMetadata)},
                query_lens=q_lens.tolist(),
                context_lens=(seq_lens_cpu[nd:] - q_lens).tolist())
            meta.prefill.prefill_backend.prepare_metadata(meta.prefill)
        return meta


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t's first `rows` rows, zero rows appended where t has fewer (a new tensor)."""
    out = t.new_zeros(rows, *t.shape[1:])
    m = min(rows, t.shape[0])
    out[:m] = t[:m]
    return out


def _task_slots(slot_mapping: torch.Tensor, rows: int) -> torch.Tensor:
    """int32 slots for a cache-write task of `rows` rows; padding tokens (PAD_SLOT_ID, or
    past the batch) go to slot 0 of vLLM's null block, which no request reads."""
    return _padded_rows(slot_mapping.to(torch.int32), rows).clamp_(min=0)


def _batch_num_tokens() -> int | None:
    """Tokens of the running batch (padding excluded); None in profile / dummy runs."""
    if not is_forward_context_available():
        return None
    meta = get_forward_context().attn_metadata
    if isinstance(meta, list):
        meta = meta[0] if meta else None
    if isinstance(meta, dict):
        meta = next(iter(meta.values()), None)
    return None if meta is None else meta.num_actual_tokens


class NPUMLAImpl(MLACommonImpl[NPUMLAMetadata]):
    # DCP: decode returns its lse (npu_multi_head_latent_attention), vLLM's MLA layer
    # gathers the query heads before and merges the ranks' outputs after.
    can_return_lse_for_decode: bool = True
    supports_dcp: bool = True
    supports_pcp: bool = True  # with the NPU runner's token chunks (prefill_context_parallel)

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None, attn_type: str,
                 kv_sharing_target_layer_name: str | None, **mla_args) -> None:
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap,
                       "indexer (sparse MLA)": mla_args.get("indexer")}
        used = [k for k, v in unsupported.items() if v is not None]
        if used:
            raise NotImplementedError(f"NPU MLA backend does not support {used}")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"NPU MLA backend supports decoder attention only, "
                                      f"got attn_type={attn_type!r}")
        if kv_cache_dtype not in NPUMLABackend.supported_kv_cache_dtypes:
            raise NotImplementedError(f"NPU MLA backend: kv_cache_dtype={kv_cache_dtype!r}; "
                                      f"supported: {NPUMLABackend.supported_kv_cache_dtypes}")
        dims = (mla_args.get("kv_lora_rank"), mla_args.get("qk_rope_head_dim"))
        if dims != (ATB_MLA_LATENT, ATB_MLA_ROPE):
            raise NotImplementedError(
                f"NPU MLA backend: kv_lora_rank {dims[0]} / qk_rope_head_dim {dims[1]}; the "
                f"NPU's MLA kernels take {ATB_MLA_LATENT} / {ATB_MLA_ROPE} (DeepSeek-V2/V3, "
                "Kimi-K2)")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes,
                         sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
                         kv_sharing_target_layer_name, **mla_args)
        self.decode_heads = padded_heads(num_heads * self.dcp_world_size)
        self.cp_interleave = \
            get_current_vllm_config().parallel_config.cp_kv_cache_interleave_size
        self.supports_quant_query_input = False
        self._use_flashinfer_concat_mla_k = False
        self._captured_cache_task: tuple | None = None
        self._update_args: MLAUpdateArgs | None = None

    # ---- cache write -------------------------------------------------------------
    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           kv_cache_dtype: str, k_scale: torch.Tensor,
                           skip_scale: bool = False) -> None:
        """kv_c_normed [T, L], k_pe [T, 1, R] -> latent rows of kv_cache [nb, bs, L+R]."""
        if kv_cache.numel() == 0:
            return
        n = _batch_num_tokens()
        if n is None:
            return
        if self.pcp_world_size > 1:
            # vLLM's MLA layer has gathered every rank's chunk (the batch in order, then
            # pad rows) against the whole batch's slot mapping.
            n = min(kv_c_normed.shape[0], slot_mapping.shape[0])
        # [T, 1, L] and [T, 1, R], contiguous: the two planes' new rows
        c = kv_c_normed[:n].to(kv_cache.dtype).reshape(n, 1, -1).contiguous()
        r = k_pe[:n].to(kv_cache.dtype).reshape(n, 1, -1).contiguous()
        backend = get_graph_backend()
        if backend.is_capturing():
            # One row per token of the captured batch; update_graph_params gives each
            # replay's slots (padding tokens into the null block).
            task, _ = as_task(backend, self._write_rows, c, r, kv_cache,
                              _task_slots(slot_mapping, n))
            self._captured_cache_task = (task, c, r)
            return
        slots = slot_mapping[:n].to(torch.int32)
        if (slots < 0).any():  # PAD_SLOT_ID: graph padding, other DCP ranks' tokens
            local = slots >= 0
            c, r, slots = c[local], r[local], slots[local]
        self._write_rows(c, r, kv_cache, slots)

    def _write_rows(self, c: torch.Tensor, r: torch.Tensor, kv_cache: torch.Tensor,
                    slots: torch.Tensor) -> None:
        nope, rope = latent_planes(kv_cache, self.kv_lora_rank)
        ops._npu_reshape_and_cache(c, r, nope, rope, slots)

    # ---- prefill: expand latents, dense causal attention ---------------------------
    def _gather_latents(self, kv_cache: torch.Tensor, block_row: torch.Tensor,
                        n: int) -> torch.Tensor:
        """The first n latent rows of one request: [n, L+R]."""
        nope, rope = latent_planes(kv_cache, self.kv_lora_rank)
        bs = nope.shape[1]
        blocks = block_row[:-(-n // bs)].long()
        return torch.cat((nope[blocks].flatten(0, 2)[:n], rope[blocks].flatten(0, 2)[:n]), -1)

    def _prefill_latents(self, new_rows: torch.Tensor, kv_cache: torch.Tensor,
                         p: NPUMLAPrefillMetadata) -> torch.Tensor:
        """[cached context | new tokens] per request, concatenated: [sum kv, L+R]."""
        if not any(p.context_lens):  # global lengths: every DCP rank decides alike
            return new_rows
        contexts = self._contexts(kv_cache, p)
        pieces, start = [], 0
        for rows, q_len in zip(contexts, p.query_lens):
            pieces += [rows.to(new_rows.dtype), new_rows[start:start + q_len]]
            start += q_len
        return torch.cat(pieces)

    def _contexts(self, kv_cache: torch.Tensor, p: NPUMLAPrefillMetadata):
        """Each prefill's cached latent rows; with DCP, all ranks' shards gathered."""
        if self.dcp_world_size == 1:
            return [self._gather_latents(kv_cache, p.block_table[r], n)
                    for r, n in enumerate(p.context_lens)]
        from vllm.distributed import get_dcp_group

        local = get_dcp_local_seq_lens(torch.tensor(p.context_lens, dtype=torch.int32),
                                       self.dcp_world_size, self.dcp_rank,
                                       self.cp_interleave).tolist()
        rows = [self._gather_latents(kv_cache, p.block_table[r], n)
                for r, n in enumerate(local)]
        return gather_sharded_rows(get_dcp_group(), rows, p.context_lens, self.cp_interleave)

    def forward_mha(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: NPUMLAMetadata,
                    k_scale: torch.Tensor, output: torch.Tensor,
                    output_scale: torch.Tensor | None = None) -> None:
        """q [Tp, N, P+R], kv_c_normed [Tp, L], k_pe [Tp, 1, R] -> output [Tp, N*V]."""
        if output_scale is not None:
            raise NotImplementedError("NPU MLA backend: fused output quantization")
        p = attn_metadata.prefill
        t = q.shape[0]
        new_rows = torch.cat((kv_c_normed, k_pe.reshape(t, -1)), dim=-1)
        latents = self._prefill_latents(new_rows, kv_c_and_k_pe_cache, p)
        kv_c, k_rope = latents.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(kv_c.contiguous())[0].view(
            -1, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = self._concat_k_nope_k_pe(k_nope, k_rope.unsqueeze(1))
        kv_lens = [c + n for c, n in zip(p.context_lens, p.query_lens)]
        out = p.prefill_backend.run_prefill(q, k, v, cumulative(p.query_lens),
                                            cumulative(kv_lens))
        output.view(t, self.num_heads, self.v_head_dim).copy_(out)

    # ---- decode: absorbed query against the latent cache ---------------------------
    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: NPUMLAMetadata,
                    layer: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q = (ql_nope [B, N, L], q_pe [B, N, R]) -> latent output [B, N, L]."""
        d = attn_metadata.decode
        q_nope, q_rope = q if isinstance(q, tuple) else q.split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        act_dtype, heads = q_nope.dtype, q_nope.shape[1]
        cache_dtype = kv_c_and_k_pe_cache.dtype  # the op takes one dtype throughout
        q_nope = _pad_heads(q_nope.to(cache_dtype), self.decode_heads)
        q_rope = _pad_heads(q_rope.to(cache_dtype), self.decode_heads)
        if self.dcp_world_size > 1:
            out, lse = self._decode_with_lse(q_nope, q_rope, kv_c_and_k_pe_cache, d)
            return out[:, :heads].to(act_dtype), lse[:, :heads]
        out = q_nope.new_empty(q_nope.shape)
        backend = get_graph_backend()
        capturing = backend.is_capturing()
        if d.query_ends is not None:  # drafts to verify: the fused op's MLA form
            call = self._spec_call(q_nope, q_rope, kv_c_and_k_pe_cache, d.block_table,
                                   d.seq_lens.tolist(), d.query_ends, d.attn_mask)
            lse = torch.zeros(1, dtype=torch.float32, device=out.device)
            workspace = fia_max_workspace(call) if capturing else None
            attention, _ = as_task(backend if capturing else None, fia_out, call, out, lse,
                                   workspace)
            extra = dict(query_len=d.query_ends[0], workspace=workspace, lse=lse)
        else:
            attention, _ = as_task(backend if capturing else None, self._decode, q_nope,
                                   q_rope, kv_c_and_k_pe_cache, d.block_table,
                                   d.seq_lens.tolist(), out)
            extra = {}
        if not capturing:
            return out[:, :heads].to(act_dtype), None
        cache_write, c, r = self._captured_cache_task or (None, None, None)
        self._captured_cache_task = None
        GRAPH_PARAMS.register(get_forward_context().batch_descriptor, layer.layer_name,
                              MLATasks(cache_write=cache_write, attention=attention,
                                       nope_rows=c, rope_rows=r, q_nope=q_nope,
                                       q_rope=q_rope, kv_cache=kv_c_and_k_pe_cache,
                                       output=out, **extra))
        return out[:, :heads].to(act_dtype), None

    def _spec_call(self, q_nope, q_rope, cache, block_table, seq_lens, query_ends, mask):
        nope, rope = latent_planes(cache, self.kv_lora_rank)
        return spec.fia_args(q_nope, q_rope, nope, rope, block_table, seq_lens, query_ends,
                             mask, self.scale)

    def _decode(self, q_nope: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                block_table: torch.Tensor, seq_lens: list[int], out: torch.Tensor) -> None:
        """The decode attention call, shared by eager runs, capture and task updates."""
        nope, rope = latent_planes(cache, self.kv_lora_rank)
        ops.npu_multi_head_latent_attention(q_nope, q_rope, nope, rope, block_table,
                                            seq_lens, q_nope.shape[1], self.scale, 1,
                                            output=out)

    def graph_update_args(self, tasks: MLATasks, meta: NPUMLAMetadata) -> MLAUpdateArgs:
        """What the update re-issues the tasks with, built before it, on the compute stream
        (the update stream is not ordered after it: ops/sim/update_stream.py). Each task
        keeps the captured batch's shape: padding tokens write into vLLM's null block
        (block 0, never given to a request) and padding requests have length 0 (as
        vllm-ascend pads its lengths); their outputs are never read."""
        d = meta.decode
        batch = tasks.q_nope.shape[0]
        slots = None if tasks.cache_write is None else _task_slots(
            meta.slot_mapping[:meta.num_actual_tokens], tasks.nope_rows.shape[0])
        host_lens = d.seq_lens.tolist()  # host int32 (the builder's)
        if tasks.query_len > 1:
            ends, lens, table = spec.padded_batch(
                d.query_ends or list(range(1, len(host_lens) + 1)), host_lens,
                d.block_table, batch, tasks.query_len)
            return MLAUpdateArgs(table, lens, slots, ends)
        lens = (host_lens + [0] * batch)[:batch]  # padding requests: length 0
        return MLAUpdateArgs(_padded_rows(d.block_table, batch), lens, slots)

    def update_graph_params(self, backend, stream, tasks: MLATasks, meta: NPUMLAMetadata,
                            args: MLAUpdateArgs) -> None:
        """Re-issue this layer's captured tasks for a new pure-decode batch (before a FULL
        replay): the latent write of its tokens, then attention over its lengths."""
        # The tasks hold these tensors' addresses: keep them until the next update.
        self._update_args = args
        if tasks.cache_write is not None:
            backend.task_update_begin(stream, tasks.cache_write)
            self._write_rows(tasks.nope_rows, tasks.rope_rows, tasks.kv_cache, args.slots)
            backend.task_update_end(stream)
        backend.task_update_begin(stream, tasks.attention)
        if tasks.query_len > 1:
            fia_out(self._spec_call(tasks.q_nope, tasks.q_rope, tasks.kv_cache, args.table,
                                     args.seq_lens, args.query_ends, meta.decode.attn_mask),
                     tasks.output, tasks.lse, tasks.workspace)
        else:
            self._decode(tasks.q_nope, tasks.q_rope, tasks.kv_cache, args.table,
                         args.seq_lens, tasks.output)
        backend.task_update_end(stream)

    def _decode_with_lse(self, q_nope: torch.Tensor, q_rope: torch.Tensor,
                         cache: torch.Tensor, d: NPUMLADecodeMetadata):
        """DCP decode: q_nope [B, W*N, L], q_rope [B, W*N, R] (all DCP ranks' heads) over
        this rank's shard (seq_lens are local; 0 where the rank holds none) -> out
        [B, W*N, L], lse [B, W*N]."""
        b, heads, _ = q_nope.shape
        nope, rope = latent_planes(cache, self.kv_lora_rank)
        out = q_nope.new_empty(b, heads, self.kv_lora_rank)
        lse = q_nope.new_empty(b, heads, 1)  # the op writes lse in the query dtype
        ops.npu_multi_head_latent_attention(
            q_nope, q_rope, nope, rope, d.block_table, d.seq_lens.tolist(), heads,
            self.scale, 1, calc_type="calc_type_ring", return_lse=True, output=out, lse=lse)
        return out, lse[..., 0].float()
