"""Standard paged attention (MHA / GQA / MQA) on the NPU op surface: backend, builder, impl.

KV cache of one layer, as vLLM allocates it for this backend (two head slots, LHBNC):

    kv_cache [num_blocks, 2, block_size, Hkv*D]
              K plane = kv_cache[:, 0]   contiguous [num_blocks, block_size, Hkv*D]
              V plane = kv_cache[:, 1]   contiguous
    slot s -> (block s // block_size, offset s % block_size)

Kernels: new tokens go into the cache with `_npu_reshape_and_cache`; a pure-decode batch
reads it with `_npu_paged_attention` (or FIA, per config); every other batch — prefill,
chunked prefill, prefix-cache hits, mixed — with one `npu_fused_infer_attention_score`
call in TND layout with right-down causal masking (band masking for sliding windows).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.utils.torch_utils import get_dtype_size
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout

from vllm_npu import kv_layout, ops
from vllm_npu.attention.context_parallel import (
    DCPMetadata,
    build_dcp_metadata,
    combine_over_ranks,
    merge_partials,
)
from vllm_npu.attention import dense_tnd
from vllm_npu.attention.batch_padding import pad_query_ends, table_for
from vllm_npu.attention.fia_calls import as_task, fia_max_workspace, fia_out
from vllm_npu.attention.host_lens import host_seq_lens
from vllm_npu.attention.softcap import softcap_attention
from vllm_npu.attention.prefill_context_parallel import (
    PCPMetadata,
    build_pcp_metadata,
    gather_chunks,
    is_slice_active,
)
from vllm_npu.compilation.graph_backend import get_graph_backend
from vllm_npu.compilation.graph_params import GRAPH_PARAMS, AttentionTasks
from vllm_npu.config import get_npu_config
from vllm_npu.ops.sim.task_args import DeviceRef

MASK_SIDE = 2048  # the fused op's compressed causal mask is always 2048 x 2048


class NPUAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    # float32 is accepted for the simulated NPU only; the platform refuses it on a device.
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @classmethod
    def full_path(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(128)]  # page attention: 128..512 in steps of 128

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(range(16, 513, 16))

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # K and V as separate contiguous planes; block-compact pages where Mamba-style
        # state shares the pool (kv_layout.paired_planes)
        return (KVCacheLayout.LHBNC, KVCacheLayout.LBHNC)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        if spec.state_content_bytes is not None:
            return spec
        if spec.head_size != spec.head_size_v:
            raise ValueError(f"{cls.__name__}: K head size {spec.head_size} != V head size "
                             f"{spec.head_size_v} is not supported")
        return replace(spec, num_head_slots=2,
                       state_content_bytes=spec.num_kv_heads * spec.head_size
                       * get_dtype_size(spec.dtype))

    @staticmethod
    def get_impl_cls() -> type["NPUAttentionImpl"]:
        return NPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["NPUAttentionMetadataBuilder"]:
        return NPUAttentionMetadataBuilder


@dataclass(slots=True)  # not frozen: vLLM's chunked-local builder sets its hook after build
class NPUAttentionMetadata:
    num_actual_tokens: int       # tokens in the batch, padding excluded
    num_reqs: int
    is_pure_decode: bool         # every request has exactly one query token
    query_ends: list[int]        # host, [num_reqs] cumulative query ends (TND actual_seq_lengths)
    seq_lens_list: list[int]     # host, [num_reqs] kv length per request incl. new tokens
    seq_lens: torch.Tensor       # host int32 [num_reqs] (paged attention's context_lens)
    block_table: torch.Tensor    # int32 [num_reqs, max_blocks_per_req]
    slot_mapping: torch.Tensor   # int32 [num_actual_tokens]
    attn_mask: torch.Tensor      # bool [2048, 2048], True above the diagonal (masked)
    dcp: DCPMetadata | None = None  # decode context parallelism: this rank's context shard
    pcp: PCPMetadata | None = None  # prefill context parallelism: this rank's query pieces
    # Llama 4's chunked local attention (vLLM's ChunkedLocalAttentionBuilder): the batch is
    # its virtual per-chunk requests; this maps a block table to theirs
    make_virtual_batches_block_table: object = None


def _soft_capped(vllm_config: VllmConfig | None) -> bool:
    """A layer of the model caps its logits (softcap.py: eager only, no FULL graphs)."""
    layers = vllm_config.compilation_config.static_forward_context if vllm_config else {}
    return any(getattr(getattr(layer, "impl", None), "logits_soft_cap", None)
               for layer in layers.values())


def uses_dcp(vllm_config: VllmConfig | None) -> bool:
    return vllm_config is not None and vllm_config.parallel_config.decode_context_parallel_size > 1


class NPUAttentionMetadataBuilder(AttentionMetadataBuilder[NPUAttentionMetadata]):
    impl_cls: ClassVar[type]  # set below; its update_graph_params makes FULL graphs safe

    @classmethod
    def get_cudagraph_support(cls, vllm_config: VllmConfig,
                              kv_cache_spec: AttentionSpec) -> AttentionCGSupport:
        """FULL graphs (any batch) only with the parameter-update hook: without it a
        replayed attention task keeps the capture's sequence lengths and block table.
        With DCP, pure-decode batches only: whether a batch has cached context (and so
        runs the context path with its collectives) is decided on the host."""
        if not callable(getattr(cls.impl_cls, "update_graph_params", None)) \
                or _soft_capped(vllm_config):
            return AttentionCGSupport.NEVER
        if uses_dcp(vllm_config):
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        return AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.attn_mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool,
                                    device=device).triu_(1)
        parallel = vllm_config.parallel_config
        self.dcp_world = parallel.decode_context_parallel_size
        self.pcp_world = parallel.prefill_context_parallel_size
        self.dcp_interleave = parallel.cp_kv_cache_interleave_size
        self.speculative = vllm_config.speculative_config is not None
        self._slots_mirror: tuple[tuple[int, int], torch.Tensor] | None = None
        self._table_mirror: tuple[tuple[int, int], torch.Tensor] | None = None
        layout = vllm_config.cache_config.kv_cache_layout
        self.paired = layout is not None and KVCacheLayout[layout].is_block_compact

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NPUAttentionMetadata:
        cm = common_attn_metadata
        n_reqs, n_tokens = cm.num_reqs, cm.num_actual_tokens
        query_ends = cm.query_start_loc_cpu[1:n_reqs + 1].tolist()
        seq_lens_cpu = host_seq_lens(cm, n_reqs, self.speculative)
        dcp = None
        if self.dcp_world > 1:
            from vllm.distributed import get_dcp_group

            q_lens = cm.query_start_loc_cpu[1:n_reqs + 1] - cm.query_start_loc_cpu[:n_reqs]
            dcp = build_dcp_metadata(seq_lens_cpu - q_lens.to(torch.int32), self.dcp_world,
                                     get_dcp_group().rank_in_group, self.dcp_interleave)
        pcp = None
        if self.pcp_world > 1:
            from vllm.distributed.parallel_state import get_pcp_group

            pcp = build_pcp_metadata(cm.query_start_loc_cpu[:n_reqs + 1].tolist(),
                                     seq_lens_cpu.tolist(), n_tokens, self.pcp_world,
                                     get_pcp_group().rank_in_group)
        return NPUAttentionMetadata(
            num_actual_tokens=n_tokens,
            num_reqs=n_reqs,
            is_pure_decode=cm.max_query_len == 1,
            query_ends=query_ends,
            seq_lens_list=seq_lens_cpu.tolist(),
            seq_lens=seq_lens_cpu,
            block_table=self._block_ids(cm.block_table_tensor[:n_reqs]),
            slot_mapping=self._int32_slots(cm.slot_mapping[:n_tokens]),
            attn_mask=self.attn_mask,
            dcp=dcp,
            pcp=pcp,
        )

    def _block_ids(self, table: torch.Tensor) -> torch.Tensor:
        if table.dtype != torch.int32:
            table = table.to(torch.int32)
        if not self.paired:
            return table  # vLLM's persistent table: graph tasks read it in place
        # paired pages: written into a mirror of vLLM's table, which captured tasks read
        return kv_layout.paired_block_ids(self._mirrored(table, "_table_mirror"))

    def _int32_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """vLLM's int64 slots as the int32 the NPU ops take (see _mirrored)."""
        if slots.dim() != 1 or not slots.is_contiguous():
            out = slots.to(torch.int32)
        else:
            out = self._mirrored(slots, "_slots_mirror")
        if self.paired:
            kv_layout.paired_slots(out, self.kv_cache_spec.block_size)
        return out

    def _mirrored(self, src: torch.Tensor, attr: str) -> torch.Tensor:
        """`src` (a view of one of vLLM's per-step buffers) as int32, written at the same
        place of an int32 mirror of that buffer: a captured graph's task then finds each
        step's values where it read the captured ones, and views of one buffer
        (micro-batches) stay apart."""
        storage = src.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        mirror = getattr(self, attr)  # read once: builders shared across threads stay apart
        if mirror is None or mirror[0] != key:
            mirror = (key, torch.empty(storage.nbytes() // src.element_size(),
                                       dtype=torch.int32, device=src.device))
            setattr(self, attr, mirror)
        return mirror[1].as_strided(src.shape, src.stride(),
                                    src.storage_offset()).copy_(src)


class NPUAttentionImpl(AttentionImpl[NPUAttentionMetadata]):
    supports_dcp: bool = True
    supports_pcp: bool = True  # with the NPU runner's token slicing (prefill_context_parallel)
    can_return_lse_for_decode: bool = True  # the fused op's softmax_lse_flag

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("NPU attention backend does not support ['alibi_slopes']")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"NPU attention backend supports decoder attention "
                                      f"only, got attn_type={attn_type!r}")
        if self.dcp_world_size > 1 and (sliding_window is not None or sinks is not None):
            raise NotImplementedError(
                f"NPU attention backend: decode context parallelism with a sliding window "
                f"({sliding_window}) or attention sinks is not supported; use "
                "--decode-context-parallel-size 1")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        # [H] per-head sink logits (gpt-oss): FIA v2 only, ATB paged attention takes none
        self.sinks = sinks
        # Gemma 2: no kernel takes a soft cap, these layers run softcap.py's composition
        self.logits_soft_cap = logits_soft_cap or None
        self.use_paged_decode = (get_npu_config().decode_attention_op == "paged_attention"
                                 and sliding_window is None and sinks is None
                                 and not logits_soft_cap)
        if self.logits_soft_cap and (self.dcp_world_size > 1 or self.pcp_world_size > 1):
            raise NotImplementedError(
                "NPU attention backend: logit soft-capping (an eager composition, softcap.py) "
                "with context parallelism is not supported; use --decode-context-parallel-size "
                "1 and --prefill-context-parallel-size 1")
        self._lse: torch.Tensor | None = None  # the fused op's unused LSE output
        self._captured_cache_task: tuple | None = None
        self._views: tuple | None = None  # _cache_views: (kv_cache, its four views)

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """Sinks in the dtype FIA v2 takes: bfloat16 (float32 beside float32 activations,
        the simulator's extension); a float16 model's are cast once, here."""
        want = torch.float32 if act_dtype == torch.float32 else torch.bfloat16
        if self.sinks is not None and self.sinks.dtype != want:
            self.sinks = self.sinks.to(want)

    def _cache_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """kv_cache [num_blocks, 2, bs, Hkv*D] -> K, V planes [num_blocks, bs, Hkv*D] and
        their per-head views [num_blocks, bs, Hkv, D]. Made once per cache tensor: every
        step passes the same view objects (a graph task update then hands the simulated
        device tensors its tasks already hold, instead of four fresh views per call)."""
        views = self._views
        if views is None or views[0] is not kv_cache:
            k_plane, v_plane = kv_layout.paired_planes(kv_cache)
            views = self._views = (kv_cache, k_plane, v_plane, *(
                plane.view(*plane.shape[:2], self.num_kv_heads, self.head_size)
                for plane in (k_plane, v_plane)))
        return views[1:]

    def _write_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                     meta: NPUAttentionMetadata) -> None:
        _, _, k_heads, v_heads = self._cache_views(kv_cache)
        ops._npu_reshape_and_cache(key, value, k_heads, v_heads, meta.slot_mapping)

    def _paged_args(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: NPUAttentionMetadata,
                    out: torch.Tensor, seq_lens: torch.Tensor | None = None) -> dict:
        _, _, k_heads, v_heads = self._cache_views(kv_cache)
        return dict(query=q, key_cache=k_heads, value_cache=v_heads, num_kv_heads=self.num_kv_heads,
                    num_heads=self.num_heads, scale_value=self.scale,
                    block_table=meta.block_table,
                    context_lens=meta.seq_lens if seq_lens is None else seq_lens, out=out)

    def _fia_args(self, q: torch.Tensor, kv_cache: torch.Tensor,
                  meta: NPUAttentionMetadata) -> tuple[tuple, dict]:
        k_plane, v_plane = self._cache_views(kv_cache)[:2]
        window = {"sparse_mode": 3}
        if self.sliding_window is not None:
            window = {"sparse_mode": 4, "pre_tokens": self.sliding_window - 1,
                      "next_tokens": 0}
        ends, kv_lens = pad_query_ends(q.shape[0], meta.query_ends, meta.seq_lens_list)
        return (q, k_plane, v_plane), dict(
            atten_mask=meta.attn_mask, actual_seq_lengths=ends,
            actual_seq_lengths_kv=kv_lens, block_table=table_for(meta, len(ends)),
            num_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            scale=self.scale, input_layout="TND", block_size=k_plane.shape[1], **window)

    def _attend(self, kind: str, q: torch.Tensor, kv_cache: torch.Tensor,
                meta: NPUAttentionMetadata, out: torch.Tensor,
                workspace: torch.Tensor | None = None) -> None:
        """The one attention call, shared by eager runs, graph capture and task updates
        (`workspace`: a graph task's, kept alive with its tasks; None: the op's own)."""
        if kind == "paged_decode":
            ops._npu_paged_attention(**self._paged_args(q, kv_cache, meta, out),
                                     workspace=workspace)
            return
        if self._lse is None:
            self._lse = torch.zeros(1, dtype=torch.float32, device=q.device)
        fia_out(self._fia_args(q, kv_cache, meta), out, self._lse, workspace, self.sinks)

    def _attend_softcap(self, query: torch.Tensor, kv_cache: torch.Tensor,
                        meta: NPUAttentionMetadata, out: torch.Tensor) -> None:
        if get_graph_backend().is_capturing():  # the builder reports NEVER: unreachable
            raise RuntimeError("NPU attention backend: logit soft-capping runs eagerly")
        _, _, k_heads, v_heads = self._cache_views(kv_cache)
        softcap_attention(query, k_heads, v_heads, meta.block_table, meta.query_ends,
                          meta.seq_lens_list, self.scale, self.logits_soft_cap,
                          self.sliding_window, out)

    def _task_workspace(self, kind: str, q: torch.Tensor, kv_cache: torch.Tensor,
                        meta: NPUAttentionMetadata, out: torch.Tensor) -> torch.Tensor:
        """A graph task's workspace, large enough for every batch it is updated with: FIA's
        "max" workspace depends on shapes only; paged attention's grows with the context,
        so it is sized for the longest one the captured block table can address."""
        if kind == "paged_decode":
            longest = meta.block_table.shape[1] * kv_cache.shape[2]
            with get_graph_backend().host_work():  # host lengths: not graph work
                lens = torch.full_like(meta.seq_lens, longest)
                return ops._npu_paged_attention_get_workspace(
                    **self._paged_args(q, kv_cache, meta, out, seq_lens=lens))
        return fia_max_workspace(self._fia_args(q, kv_cache, meta), self.sinks)

    def _attend_dcp(self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    kv_cache: torch.Tensor, meta: NPUAttentionMetadata, out: torch.Tensor,
                    backend=None) -> DCPTasks | None:
        """Context shard (all DCP ranks' heads, merged over ranks) + new tokens, merged.

        Under graph capture (`backend` given) the two attention calls are separate tasks
        (FIA `.out` with their own outputs and workspaces) and the context path is always
        taken; returns their handles and buffers for update_graph_params."""
        (t, heads, d), nq, nk, nv = q.shape, *dense_tnd.prepare(q, key, value)
        new = self._dcp_new_tokens_args(nq, nk, nv, meta)
        new_out = nq.new_empty(t, heads, nv.shape[-1])
        new_lse = q.new_empty(t, heads, 1, dtype=torch.float32)
        new_ws = fia_max_workspace(new) if backend is not None else None
        new_task, _ = as_task(backend, fia_out, new, new_out, new_lse, new_ws)
        if backend is None and not meta.dcp.any_context:
            out.copy_(new_out[..., :d])
            return None
        from vllm.distributed import get_dcp_group

        group = get_dcp_group()
        q_all = group.all_gather(q.contiguous(), dim=1)  # [T, W*H, D]
        ctx = self._dcp_context_args(q_all, kv_cache, meta)
        ctx_out = torch.empty_like(q_all)
        ctx_lse = q_all.new_empty(t, q_all.shape[1], 1, dtype=torch.float32)
        ctx_ws = fia_max_workspace(ctx) if backend is not None else None
        ctx_task, _ = as_task(backend, fia_out, ctx, ctx_out, ctx_lse, ctx_ws)
        merged_ctx, merged_lse = combine_over_ranks(group, ctx_out, ctx_lse[..., 0],
                                                    self.num_heads)
        merged, _ = merge_partials([merged_ctx, new_out[..., :d].to(q.dtype)],
                                   [merged_lse, new_lse[..., 0]])
        out.copy_(merged)
        if backend is None:
            return None
        return DCPTasks(new_tokens=new_task, context=ctx_task, query=nq, key=nk, value=nv,
                        q_all=q_all, new_out=new_out, new_lse=new_lse, new_workspace=new_ws,
                        ctx_out=ctx_out, ctx_lse=ctx_lse, ctx_workspace=ctx_ws)

    @staticmethod
    def _gather_new_tokens(key: torch.Tensor, value: torch.Tensor, pcp: PCPMetadata):
        """PCP: every rank's chunk of this step's K/V, in batch order (one all-gather)."""
        from vllm.distributed.parallel_state import get_pcp_group

        full = gather_chunks(get_pcp_group(), torch.cat((key, value), dim=-1), pcp)
        return full.split([key.shape[-1], value.shape[-1]], dim=-1)

    def _attend_pcp(self, query: torch.Tensor, kv_cache: torch.Tensor,
                    meta: NPUAttentionMetadata, output: torch.Tensor) -> None:
        """PCP: this rank's query pieces over the paged cache, which already holds every
        new token of the step (written by do_kv_cache_update); pad rows get zeros."""
        pcp = meta.pcp
        n = pcp.num_run
        local = replace(meta, num_actual_tokens=n, num_reqs=len(pcp.query_ends),
                        is_pure_decode=False, query_ends=pcp.query_ends,
                        seq_lens_list=pcp.kv_lens,
                        seq_lens=torch.tensor(pcp.kv_lens, dtype=torch.int32),
                        block_table=meta.block_table[pcp.rows])
        self._attend("fused", query[:n], kv_cache, local, output[:n])
        output[n:].zero_()

    def _dcp_new_tokens_args(self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             meta: NPUAttentionMetadata) -> tuple[tuple, dict]:
        """This step's tokens, which every DCP rank holds in full: causal, with lse."""
        ends, _ = pad_query_ends(q.shape[0], meta.query_ends, meta.query_ends)
        return (q, key, value), dict(
            atten_mask=meta.attn_mask, actual_seq_lengths=ends,
            actual_seq_lengths_kv=ends, num_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, scale=self.scale, input_layout="TND",
            sparse_mode=3, softmax_lse_flag=True)

    def _dcp_context_args(self, q_all: torch.Tensor, kv_cache: torch.Tensor,
                          meta: NPUAttentionMetadata) -> tuple[tuple, dict]:
        """The gathered heads over this rank's context shard. The cached context precedes
        every new token: no mask."""
        k_plane, v_plane = self._cache_views(kv_cache)[:2]
        ends, kv_lens = pad_query_ends(q_all.shape[0], meta.query_ends,
                                       meta.dcp.local_context_lens, min_kv=1)
        return (q_all, k_plane, v_plane), dict(
            actual_seq_lengths=ends, actual_seq_lengths_kv=kv_lens,
            block_table=table_for(meta, len(ends)),
            num_heads=q_all.shape[1], num_key_value_heads=self.num_kv_heads,
            scale=self.scale, input_layout="TND", block_size=k_plane.shape[1],
            softmax_lse_flag=True)

    def _kind(self, meta: NPUAttentionMetadata, capturing_desc, kv_cache: torch.Tensor) -> str:
        # A graph captured for a uniform-decode BatchDescriptor only ever replays pure
        # decode batches; any other graph may replay mixed ones, so it captures the fused op.
        decode_ok = capturing_desc is None or capturing_desc.uniform
        # ATB paged attention takes heads wider than 256 only with blocks of <= 128.
        paged_ok = self.head_size <= 256 or kv_cache.shape[2] <= 128
        if meta.is_pure_decode and self.use_paged_decode and decode_ok and paged_ok:
            return "paged_decode"
        return "fused"

    @staticmethod
    def _layer_metadata(layer: AttentionLayer):
        meta = get_forward_context().attn_metadata
        return meta.get(layer.layer_name) if isinstance(meta, dict) else meta

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if self.kv_sharing_target_layer_name is not None:
            return
        meta = self._layer_metadata(layer)
        if meta is None:  # profile / dummy run: nothing to store
            return
        if meta.pcp is not None and is_slice_active():
            key, value = self._gather_new_tokens(key, value, meta.pcp)
        n = meta.num_actual_tokens
        backend = get_graph_backend()
        key, value = key[:n], value[:n]
        task, _ = as_task(backend if backend.is_capturing() else None, self._write_cache, key,
                          value, kv_cache, meta)
        if task is not None:
            self._captured_cache_task = (task, key, value,
                                         [DeviceRef(meta.slot_mapping), DeviceRef(kv_cache)])

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: NPUAttentionMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        """query [T, H, D], key/value [T, Hkv, D] (already cached), output [T, H, D]."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("NPU attention: fused output quantization")
        if attn_metadata is None:  # profile / dummy run
            return output
        # The fused ops take a contiguous query (op-plugin FIA docs; ATB ops likewise): a
        # model without rotary (OPT, GPT-2) hands a strided view of its fused qkv rows.
        query = query if query.is_contiguous() else query.contiguous()
        if self.logits_soft_cap is not None:
            self._attend_softcap(query, kv_cache, attn_metadata, output)
            return output
        if attn_metadata.pcp is not None and is_slice_active():
            self._attend_pcp(query, kv_cache, attn_metadata, output)
            return output
        n = attn_metadata.num_actual_tokens
        backend = get_graph_backend()
        capturing = backend.is_capturing()
        if attn_metadata.dcp is not None:
            new_k, new_v = key[:n].contiguous(), value[:n].contiguous()
            dcp = self._attend_dcp(query[:n], new_k, new_v, kv_cache, attn_metadata,
                                   output[:n], backend if capturing else None)
            if capturing:
                self._register_tasks(layer, "dcp", dcp.new_tokens, query[:n], kv_cache,
                                     output[:n], dcp=dcp)
            return output
        if not capturing:
            self._attend(self._kind(attn_metadata, None, kv_cache), query[:n], kv_cache,
                         attn_metadata, output[:n])
            return output
        kind = self._kind(attn_metadata, get_forward_context().batch_descriptor, kv_cache)
        workspace = self._task_workspace(kind, query[:n], kv_cache, attn_metadata, output[:n])
        attention, _ = as_task(backend, self._attend, kind, query[:n], kv_cache,
                               attn_metadata, output[:n], workspace)
        self._register_tasks(layer, kind, attention, query[:n], kv_cache, output[:n],
                             workspace=workspace)
        return output

    def _register_tasks(self, layer: AttentionLayer, kind: str, attention, query: torch.Tensor,
                        kv_cache: torch.Tensor, output: torch.Tensor, dcp=None,
                        workspace: torch.Tensor | None = None) -> None:
        # A layer sharing another layer's KV cache writes nothing: no cache task.
        cache_write, key_n, value_n, refs = self._captured_cache_task or (None, None, None, [])
        self._captured_cache_task = None
        GRAPH_PARAMS.register(get_forward_context().batch_descriptor, layer.layer_name,
                              AttentionTasks(cache_write=cache_write, attention=attention,
                                             kind=kind, query=query, key=key_n, value=value_n,
                                             kv_cache=kv_cache, output=output,
                                             workspace=workspace, dcp=dcp, cache_refs=refs))

    def update_graph_params(self, backend, stream, tasks: AttentionTasks,
                            meta: NPUAttentionMetadata) -> None:
        """Re-issue this layer's captured tasks for a new batch (before a FULL replay). The
        cache write reads its slots from device memory when replayed: with the batch's slots
        where it last read them (the builder's mirror buffer) and the cache where it wrote
        it, it has nothing to update; the attention takes host lengths and is always
        re-issued (as vllm-ascend does)."""
        refs = tasks.cache_refs
        if tasks.cache_write is not None and not (
                refs and refs[0].same_as(meta.slot_mapping) and refs[1].same_as(tasks.kv_cache)):
            backend.task_update_begin(stream, tasks.cache_write)
            self._write_cache(tasks.key, tasks.value, tasks.kv_cache, meta)
            backend.task_update_end(stream)
            refs[:] = [DeviceRef(meta.slot_mapping), DeviceRef(tasks.kv_cache)]
        if tasks.kind != "dcp":
            backend.task_update_begin(stream, tasks.attention)
            self._attend(tasks.kind, tasks.query, tasks.kv_cache, meta, tasks.output,
                         tasks.workspace)
            backend.task_update_end(stream)
            return
        dcp = tasks.dcp
        backend.task_update_begin(stream, tasks.attention)
        fia_out(self._dcp_new_tokens_args(dcp.query, dcp.key, dcp.value, meta),
                 dcp.new_out, dcp.new_lse, dcp.new_workspace)
        backend.task_update_end(stream)
        backend.task_update_begin(stream, dcp.context)
        fia_out(self._dcp_context_args(dcp.q_all, tasks.kv_cache, meta), dcp.ctx_out,
                 dcp.ctx_lse, dcp.ctx_workspace)
        backend.task_update_end(stream)


@dataclass(frozen=True, slots=True)
class DCPTasks:
    """The DCP graph path's two tasks and the buffers they write or read."""
    new_tokens: object            # task handle: this step's tokens (every rank holds them)
    context: object               # task handle: the gathered heads over this rank's shard
    query: torch.Tensor           # [T, H, D'] the new-token task's q, k, v: captured inputs
    key: torch.Tensor             # [T, Hkv, D'] in the dense TND form (dense_tnd.py)
    value: torch.Tensor
    q_all: torch.Tensor           # [T, W*H, D] every DCP rank's heads
    new_out: torch.Tensor         # [T, H, D'] + lse [T, H, 1]: the new-token task's results
    new_lse: torch.Tensor
    new_workspace: torch.Tensor | None
    ctx_out: torch.Tensor         # [T, W*H, D] + lse: the context task's results
    ctx_lse: torch.Tensor
    ctx_workspace: torch.Tensor | None


NPUAttentionMetadataBuilder.impl_cls = NPUAttentionImpl
