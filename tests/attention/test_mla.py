"""NPU MLA backend (builder + impl + prefill backend + ops) driven without an engine.

A small "scheduler" keeps, per request, its physical blocks and its latent history
(kv_c [len, L], k_pe [len, R]). Each step builds vLLM's `CommonAttentionMetadata` by hand,
runs the real builder, `do_kv_cache_update`, `forward_mha` for prefill tokens and
`forward_mqa` for decode tokens (with W_UK absorbed into the query before and W_UV applied
after, as vLLM's MLAAttention layer does), and checks the result against dense causal
attention computed from the UNABSORBED weights: every latent of the history expanded
through kv_b_proj to K = [k_nope | k_pe] and V.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.mla.prefill.base import MLADimensions
from vllm.v1.attention.backends.mla.prefill.selector import MLAPrefillSelectorConfig
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from vllm_npu import ops
from vllm_npu.attention.mla import (
    NPUMLABackend,
    NPUMLAImpl,
    NPUMLAMetadataBuilder,
)
from vllm_npu.attention.mla_prefill import NPUMLAPrefillBackend, cumulative
from vllm_npu.kv_layout import latent_planes
from vllm_npu.platform import NPUPlatform
from tests.helpers.attention import ref_attention

BS = 128
LAYER = "model.layers.0.self_attn.mla_attn"
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=6e-2, rtol=6e-2),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
}


@dataclass(frozen=True)
class Dims:
    n: int  # heads
    L: int  # kv_lora_rank
    R: int  # qk_rope_head_dim
    P: int  # qk_nope_head_dim
    V: int  # v_head_dim


# DeepSeek-V3's real attention dims (prefill takes the dense TND form's 192/128 shape
# with 8 heads) and small nope / value dims over the kernels' 512 + 64 latent with 4 heads
# (prefill pads to 128/128, decode pads the heads to 8).
DIMS = {"dsv3": Dims(8, 512, 64, 128, 128), "small": Dims(4, 512, 64, 32, 32)}


def make_config(dims: Dims, dtype) -> VllmConfig:
    cfg = VllmConfig()
    cfg.cache_config.block_size = BS
    cfg.model_config = SimpleNamespace(dtype=dtype, max_model_len=1024,
                                       get_head_size=lambda: dims.L + dims.R,
                                       get_num_attention_heads=lambda pc: dims.n)
    return cfg


@dataclass
class Req:
    blocks: list[int]
    kv_c: torch.Tensor  # [len, L] latent history
    k_pe: torch.Tensor  # [len, R]

    @property
    def length(self) -> int:
        return self.kv_c.shape[0]


class Harness:
    def __init__(self, dims: Dims, dtype, num_blocks=12, seed=0):
        d = self.d = dims
        self.dtype = dtype
        self.g = torch.Generator().manual_seed(seed)
        self.scale = (d.P + d.R) ** -0.5
        w = torch.randn(d.n * (d.P + d.V), d.L, generator=self.g) * d.L ** -0.5
        self.w_kv_b = w.to(dtype)                                # kv_b_proj.weight
        self.W_UK, self.W_UV = self.w_kv_b.float().T.view(d.L, d.n, d.P + d.V).split(
            [d.P, d.V], dim=-1)                                  # [L, N, P], [L, N, V]
        self.cfg = make_config(d, dtype)
        prefill = NPUMLAPrefillBackend(num_heads=d.n, scale=self.scale, kv_lora_rank=d.L,
                                       qk_nope_head_dim=d.P, qk_rope_head_dim=d.R,
                                       v_head_dim=d.V, vllm_config=self.cfg)
        self.layer = SimpleNamespace(layer_name=LAYER, q_lora_rank=None, kv_lora_rank=d.L,
                                     qk_nope_head_dim=d.P, qk_rope_head_dim=d.R,
                                     v_head_dim=d.V, prefill_backend=prefill)
        self.cfg.compilation_config.static_forward_context[LAYER] = self.layer
        spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=d.L + d.R,
                                dtype=dtype)
        with set_current_vllm_config(self.cfg):
            self.builder = NPUMLAMetadataBuilder(spec, [LAYER], self.cfg, torch.device("cpu"))
            self.impl = NPUMLAImpl(
                num_heads=d.n, head_size=d.L + d.R, scale=self.scale, num_kv_heads=1,
                alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
                logits_soft_cap=None, attn_type=AttentionType.DECODER,
                kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=d.L,
                qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, qk_head_dim=d.P + d.R,
                v_head_dim=d.V, kv_b_proj=lambda x: (x @ self.w_kv_b.T, None))
        self.kv_cache = torch.zeros(num_blocks, BS, d.L + d.R, dtype=dtype)
        # Scrambled free list so requests' blocks are neither ordered nor adjacent.
        self.free = torch.randperm(num_blocks, generator=self.g).tolist()
        self.reqs: list[Req] = []

    def _rand(self, *shape):
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def add_request(self, shared_prefix_of: Req | None = None, shared_blocks: int = 0) -> Req:
        """With shared_prefix_of: its first shared_blocks blocks are reused (prefix hit)."""
        if shared_prefix_of is None:
            req = Req([], self._rand(0, self.d.L), self._rand(0, self.d.R))
        else:
            n_tok = shared_blocks * BS
            src = shared_prefix_of
            req = Req(list(src.blocks[:shared_blocks]), src.kv_c[:n_tok].clone(),
                      src.k_pe[:n_tok].clone())
        self.reqs.append(req)
        return req

    def expand(self, req: Req):
        """Unabsorbed K [len, N, P+R] and V [len, N, V] of a request's history."""
        d = self.d
        kv = (req.kv_c.float() @ self.w_kv_b.float().T).view(-1, d.n, d.P + d.V)
        k_nope, v = kv.split([d.P, d.V], dim=-1)
        k_pe = req.k_pe.float()[:, None, :].expand(-1, d.n, -1)
        return torch.cat([k_nope, k_pe], dim=-1), v

    def step(self, batch: list[tuple[Req, int]], pad: int = 0):
        """One forward over (request, new tokens); decodes (1 token) must come first."""
        d = self.d
        lens = [n for _, n in batch]
        nd = 0
        while nd < len(lens) and lens[nd] == 1:
            nd += 1
        assert all(n > 1 for n in lens[nd:]), "vLLM orders decodes before prefills"
        qs, kvcs, kpes, slots, seq_lens = [], [], [], [], []
        for req, n_new in batch:
            start = req.length
            while len(req.blocks) * BS < start + n_new:
                req.blocks.append(self.free.pop())
            qs.append(self._rand(n_new, d.n, d.P + d.R))
            kvcs.append(self._rand(n_new, d.L))
            kpes.append(self._rand(n_new, d.R))
            slots += [req.blocks[p // BS] * BS + p % BS for p in range(start, start + n_new)]
            seq_lens.append(start + n_new)
        T, B = sum(lens), len(batch)
        q = torch.cat(qs + [self._rand(pad, d.n, d.P + d.R)])
        kv_c = torch.cat(kvcs + [self._rand(pad, d.L)])
        k_pe = torch.cat(kpes + [self._rand(pad, d.R)]).unsqueeze(1)      # [T, 1, R]
        slot_mapping = torch.tensor(slots + [-1] * pad, dtype=torch.int64)
        block_table = torch.zeros(B, max(len(r.blocks) for r, _ in batch) + 1,
                                  dtype=torch.int32)
        for b, (req, _) in enumerate(batch):
            block_table[b, :len(req.blocks)] = torch.tensor(req.blocks, dtype=torch.int32)
        qsl = torch.tensor(cumulative([0] + lens), dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        cm = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl, num_reqs=B,
            num_actual_tokens=T, max_query_len=max(lens), max_seq_len=max(seq_lens),
            block_table_tensor=block_table, slot_mapping=slot_mapping,
            seq_lens_cpu_upper_bound=sl.clone())
        meta = self.builder.build(common_prefix_len=0, common_attn_metadata=cm)
        assert (meta.num_decodes, meta.num_decode_tokens) == (nd, nd)
        output = torch.full((T + pad, d.n * d.V), 123.0, dtype=self.dtype)
        with set_forward_context({LAYER: meta}, self.cfg):
            self.impl.do_kv_cache_update(kv_c, k_pe, self.kv_cache, slot_mapping, "auto",
                                         torch.tensor(1.0))
            if meta.num_prefills:
                self.impl.forward_mha(q[nd:T], kv_c[nd:T], k_pe[nd:T], self.kv_cache, meta,
                                      torch.tensor(1.0), output[nd:T])
            if nd:  # what MLAAttention.forward_impl does around forward_mqa
                q_nope, q_pe = q[:nd].split([d.P, d.R], dim=-1)
                ql_nope = torch.einsum("bnp,lnp->bnl", q_nope.float(), self.W_UK)
                latent, lse = self.impl.forward_mqa((ql_nope.to(self.dtype), q_pe),
                                                    self.kv_cache, meta, self.layer)
                assert latent.shape == (nd, d.n, d.L) and lse is None
                out = torch.einsum("bnl,lnv->bnv", latent.float(), self.W_UV)
                output[:nd] = out.flatten(1).to(self.dtype)
        if pad:
            assert (output[T:] == 123.0).all(), "padding rows were written"
        self.last_queries = qs
        refs = []
        for (req, _), qr, c, pe in zip(batch, qs, kvcs, kpes, strict=True):
            req.kv_c = torch.cat([req.kv_c, c])
            req.k_pe = torch.cat([req.k_pe, pe])
            k, v = self.expand(req)
            refs.append(ref_attention(qr, k, v, self.scale))
        return output[:T].view(T, d.n, d.V), refs

    def check(self, out, refs):
        torch.testing.assert_close(out.float(), torch.cat(refs), **TOL[self.dtype])

    def check_cache_holds_history(self):
        nope, rope = latent_planes(self.kv_cache, self.d.L)
        for req in self.reqs:
            for p in range(req.length):
                block, offset = req.blocks[p // BS], p % BS
                assert torch.equal(nope[block, offset, 0], req.kv_c[p])
                assert torch.equal(rope[block, offset, 0], req.k_pe[p].flatten())


# ---------------------------------------------------------------------- forward scenarios


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dims", list(DIMS))
def test_pure_prefill(dims, dtype):
    h = Harness(DIMS[dims], dtype)
    a, b, c = h.add_request(), h.add_request(), h.add_request()
    out, refs = h.step([(a, 130), (b, 5), (c, 128)])
    h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dims", list(DIMS))
def test_prefill_then_decode_across_block_boundary(dims, dtype):
    h = Harness(DIMS[dims], dtype, seed=1)
    reqs = [h.add_request() for _ in range(3)]
    out, refs = h.step([(reqs[0], 5), (reqs[1], 127), (reqs[2], 255)])
    h.check(out, refs)
    for _ in range(3):  # 127 -> 128 -> 129 -> 130 and 255 -> 258 cross block boundaries
        out, refs = h.step([(r, 1) for r in reqs])
        h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dims", list(DIMS))
def test_mixed_batch(dims, dtype):
    """Decodes, a chunked-prefill continuation and fresh prefills in one batch."""
    h = Harness(DIMS[dims], dtype, seed=2)
    a, b, c = h.add_request(), h.add_request(), h.add_request()
    h.step([(a, 129), (b, 40), (c, 100)])
    d, e = h.add_request(), h.add_request()
    out, refs = h.step([(a, 1), (b, 1), (c, 60), (d, 20), (e, 131)])
    h.check(out, refs)
    out, refs = h.step([(a, 1), (b, 1), (c, 1), (d, 1), (e, 1)])
    h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dims", list(DIMS))
def test_chunked_prefill_reads_context_from_cache(dims):
    h = Harness(DIMS[dims], torch.float32, seed=3)
    a = h.add_request()
    h.check(*h.step([(a, 200)]))
    out, refs = h.step([(a, 100)])  # second chunk: q=100, context 200 read from the cache
    h.check(out, refs)
    # The context matters: the second chunk alone gives another answer.
    k, v = h.expand(a)
    alone = ref_attention(h.last_queries[0], k[200:], v[200:], h.scale)
    assert not torch.allclose(out.float(), alone, atol=0.05)


def test_chunked_equals_unchunked(monkeypatch):
    """The same 300 tokens through one prefill vs 200 + 100 vs 1 + 127 + 172 chunks."""
    dims, T = DIMS["small"], 300
    g = torch.Generator().manual_seed(7)
    data = {(T, dims.n, dims.P + dims.R): torch.randn(T, dims.n, dims.P + dims.R, generator=g),
            (T, dims.L): torch.randn(T, dims.L, generator=g),
            (T, dims.R): torch.randn(T, dims.R, generator=g)}

    def run(chunks):
        h = Harness(dims, torch.float32, seed=8)
        req, outs, at = h.add_request(), [], 0
        for c in chunks:
            def fixed(*shape, at=at, c=c):  # step() draws q, kv_c, k_pe, then padding
                if not shape[0]:
                    return torch.zeros(shape)
                return data[(T, *shape[1:])][at:at + c]
            monkeypatch.setattr(h, "_rand", fixed)
            out, refs = h.step([(req, c)])
            h.check(out, refs)
            outs.append(out.clone())
            at += c
        return torch.cat(outs)

    one = run([300])
    torch.testing.assert_close(run([200, 100]), one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run([1, 127, 172]), one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", list(DIMS))
def test_prefix_cache_hit_reads_shared_block(dims, dtype):
    h = Harness(DIMS[dims], dtype, seed=9)
    a = h.add_request()
    h.step([(a, 140)])
    b = h.add_request(shared_prefix_of=a, shared_blocks=1)  # 128 cached tokens
    out, refs = h.step([(b, 30)])
    h.check(out, refs)
    assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
    for _ in range(2):
        h.check(*h.step([(a, 1), (b, 1)]))
    h.check_cache_holds_history()


@pytest.mark.parametrize("pad", [1, 7])
def test_padded_tokens_are_ignored(pad):
    h = Harness(DIMS["small"], torch.float32, seed=12)
    a, b = h.add_request(), h.add_request()
    h.check(*h.step([(a, 10), (b, 3)], pad=pad))  # pad slots are -1: never written
    h.check(*h.step([(a, 1), (b, 1)], pad=pad))
    h.check_cache_holds_history()


def test_ops_each_path_calls(mocker):
    h = Harness(DIMS["small"], torch.float32, seed=13)
    write = mocker.spy(ops, "_npu_reshape_and_cache")
    pa = mocker.spy(ops, "npu_multi_head_latent_attention")
    fia = mocker.spy(ops, "npu_fused_infer_attention_score")
    a, b = h.add_request(), h.add_request()
    h.step([(a, 3), (b, 4)])
    assert (write.call_count, pa.call_count, fia.call_count) == (1, 0, 1)
    h.step([(a, 1), (b, 1)])
    assert (write.call_count, pa.call_count, fia.call_count) == (2, 1, 1)
    c = h.add_request()
    h.step([(a, 1), (c, 5)])  # mixed: one decode call, one prefill call
    assert (write.call_count, pa.call_count, fia.call_count) == (3, 2, 2)


def test_profile_run_writes_nothing():
    h = Harness(DIMS["small"], torch.float32)
    with set_forward_context(None, h.cfg):
        h.impl.do_kv_cache_update(torch.ones(4, 32), torch.ones(4, 1, 16), h.kv_cache,
                                  torch.arange(4), "auto", torch.tensor(1.0))
    assert not h.kv_cache.any()


# ------------------------------------------------------------------- prefill backend API


@pytest.mark.parametrize("dims", list(DIMS))
def test_prefill_backend_contract_merges_to_full_attention(dims):
    """vLLM's interface: new-token attention + context-chunk attention, merged by lse,
    equals causal attention over [context | new]."""
    d = DIMS[dims]
    g = torch.Generator().manual_seed(14)
    be = NPUMLAPrefillBackend(num_heads=d.n, scale=0.1, kv_lora_rank=d.L,
                              qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V,
                              vllm_config=None)
    q_lens, ctx_lens = [5, 17], [130, 3]
    be.prepare_metadata(SimpleNamespace(query_lens_cpu=torch.tensor(q_lens)))
    qk = d.P + d.R
    q = torch.randn(sum(q_lens), d.n, qk, generator=g)
    k_new, v_new = torch.randn(sum(q_lens), d.n, qk, generator=g), torch.randn(
        sum(q_lens), d.n, d.V, generator=g)
    k_ctx, v_ctx = torch.randn(sum(ctx_lens), d.n, qk, generator=g), torch.randn(
        sum(ctx_lens), d.n, d.V, generator=g)
    o_new, lse_new = be.run_prefill_new_tokens(q, k_new, v_new, return_softmax_lse=True)
    chunk = SimpleNamespace(request_slice=slice(0, 2), seq_lens=torch.tensor(ctx_lens))
    o_ctx, lse_ctx = be.run_prefill_context_chunk(chunk, q, k_ctx, v_ctx)
    assert lse_new.shape == lse_ctx.shape == (d.n, sum(q_lens))
    w_new = torch.sigmoid(lse_new - lse_ctx).T.unsqueeze(-1)    # [T, N, 1]
    merged = w_new * o_new + (1 - w_new) * o_ctx
    qe, ce = cumulative([0] + q_lens), cumulative([0] + ctx_lens)
    for r in range(2):
        k = torch.cat([k_ctx[ce[r]:ce[r + 1]], k_new[qe[r]:qe[r + 1]]])
        v = torch.cat([v_ctx[ce[r]:ce[r + 1]], v_new[qe[r]:qe[r + 1]]])
        ref = ref_attention(q[qe[r]:qe[r + 1]], k, v, 0.1)
        torch.testing.assert_close(merged[qe[r]:qe[r + 1]], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dims,called,dtype", [
    (DIMS["dsv3"], (192, 128), torch.float32),           # DeepSeek-V3: the native form
    (Dims(4, 512, 64, 128, 128), (192, 128), torch.float32),  # any head count in TND
    (DIMS["small"], (128, 128), torch.float32),          # qk 96 / v 32: zero-padded
    (DIMS["small"], (128, 128), torch.float16),          # float16 runs in bfloat16
])
def test_prefill_takes_the_dense_tnd_forms_only(mocker, dims, called, dtype):
    """The dense TND form takes head dims (128, 128, 128) or (192, 192, 128 / 192) in
    bfloat16 (ops/sim/fia_shapes.py): other dims are zero-padded, float16 cast, and the
    result equals attention over the unpadded heads."""
    fia = mocker.spy(ops, "npu_fused_infer_attention_score")
    d = dims
    be = NPUMLAPrefillBackend(num_heads=d.n, scale=0.1, kv_lora_rank=d.L,
                              qk_nope_head_dim=d.P, qk_rope_head_dim=d.R,
                              v_head_dim=d.V, vllm_config=None)
    q = torch.randn(6, d.n, d.P + d.R, generator=torch.Generator().manual_seed(3)).to(dtype)
    v = torch.randn(6, d.n, d.V, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = be.run_prefill(q, q.clone(), v, [6], [6])
    assert out.shape == (6, d.n, d.V) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref_attention(q, q, v, 0.1),
                               **(TOL[torch.float32] if dtype == torch.float32
                                  else TOL[torch.bfloat16]))
    query, _, value = fia.call_args.args
    assert (query.shape[-1], value.shape[-1]) == called
    assert query.dtype == (torch.bfloat16 if dtype == torch.float16 else dtype)


def test_mla_shapes_the_kernels_lack_are_refused_at_startup():
    """ATB MLA and the fused op's MLA form take a 512 + 64 latent and at most 128 query
    heads (padded to {8, 16, 32, 64, 128}): a model outside that stops at startup."""
    from vllm_npu.attention.mla import padded_heads

    assert [padded_heads(n) for n in (1, 4, 8, 20, 128)] == [8, 8, 8, 32, 128]
    with pytest.raises(ValueError, match="at most 128"):
        padded_heads(129)
    d = Dims(4, 256, 32, 32, 32)  # MiniCPM3-like latent
    with pytest.raises(NotImplementedError, match="kv_lora_rank 256 / qk_rope_head_dim 32"):
        Harness(d, torch.float32)


# ------------------------------------------------------------------------------ platform


def _selector(**kw):
    base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=128,
                use_mla=True)
    return AttentionSelectorConfig(**(base | kw))


def test_platform_selects_npu_mla_backend():
    path = NPUPlatform.get_attn_backend_cls(None, _selector())
    assert path == NPUMLABackend.full_path()
    assert NPUPlatform.get_attn_backend_cls(None, _selector(block_size=256))
    assert NPUPlatform.get_attn_backend_cls(None, _selector(use_dcp=True)) == path
    assert NPUPlatform.get_attn_backend_cls(None, _selector(use_pcp=True)) == path


def test_platform_selects_sparse_mla_for_indexer_models():
    from vllm_npu.attention.sparse_mla import NPUSparseMLABackend

    path = NPUPlatform.get_attn_backend_cls(None, _selector(use_sparse=True))
    assert path == NPUSparseMLABackend.full_path() != NPUMLABackend.full_path()
    with pytest.raises(ValueError, match="latent head size 600"):
        NPUPlatform.get_attn_backend_cls(None, _selector(use_sparse=True, head_size=600))


@pytest.mark.parametrize("kw, match", [
    (dict(head_size=600), "latent head size"),
    (dict(head_size=50), "latent head size"),
    (dict(head_size=48), "take kv_lora_rank 512 and qk_rope_head_dim 64"),
    (dict(kv_cache_dtype="fp8"), "kv cache"),
    (dict(block_size=64), "block size"),
    (dict(has_sliding_window=True), "sliding window"),
])
def test_platform_refuses_what_mla_cannot_run(kw, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        NPUPlatform.get_attn_backend_cls(None, _selector(**kw))


def test_platform_mla_prefill_backend_is_npu():
    dims = MLADimensions(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    cfg = MLAPrefillSelectorConfig(dtype=torch.bfloat16, mla_dimensions=dims)
    assert NPUPlatform.get_mla_prefill_backend_cls(cfg) is NPUMLAPrefillBackend
    with pytest.raises(ValueError, match="dtype"):
        NPUPlatform.get_mla_prefill_backend_cls(
            MLAPrefillSelectorConfig(dtype=torch.float64, mla_dimensions=dims))


def test_impl_refuses_unsupported_features():
    d = DIMS["small"]
    common = dict(num_heads=d.n, head_size=d.L + d.R, scale=0.1, num_kv_heads=1,
                  alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
                  logits_soft_cap=None, attn_type=AttentionType.DECODER,
                  kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=d.L,
                  qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, qk_head_dim=d.P + d.R,
                  v_head_dim=d.V, kv_b_proj=None)
    with set_current_vllm_config(make_config(d, torch.float32)):
        for bad, match in ((dict(sliding_window=64), r"does not support \['sliding_window'\]"),
                           (dict(logits_soft_cap=30.0),
                            r"does not support \['logits_soft_cap'\]"),
                           (dict(kv_cache_dtype="fp8"), r"kv_cache_dtype='fp8'; supported"),
                           (dict(attn_type=AttentionType.ENCODER), "decoder attention only"),
                           (dict(indexer=object()), r"\['indexer \(sparse MLA\)'\]")):
            with pytest.raises(NotImplementedError, match=match):
                NPUMLAImpl(**(common | bad))
