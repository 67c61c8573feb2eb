"""NPUAttentionBackend / MetadataBuilder / Impl driven without an engine.

A small "scheduler" here keeps, per request, its physical blocks and its logical K/V
history; each step builds vLLM's `CommonAttentionMetadata` by hand, runs the real builder,
`do_kv_cache_update` and `forward` on an LHBNC-allocated cache, and checks the output
against dense causal attention over each request's full (prefix + new) K/V computed here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata, MultipleOf
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheLayout

import vllm_npu.config as npu_config_mod
from vllm_npu import ops
from vllm_npu.attention.backend import (
    NPUAttentionBackend,
    NPUAttentionImpl,
    NPUAttentionMetadataBuilder,
)
from vllm_npu.config import NPUConfig
from tests.helpers.attention import BS, FLOAT_DTYPES, HEADS, TOL, alloc_kv_cache, ref_attention

LAYER = "model.layers.0.self_attn.attn"


@pytest.fixture(scope="module")
def vllm_config():
    return VllmConfig()


@pytest.fixture(params=["paged_attention", "fused_infer_attention"])
def decode_op(request, monkeypatch):
    monkeypatch.setattr(npu_config_mod, "_current",
                        NPUConfig(decode_attention_op=request.param))
    return request.param


@pytest.fixture
def default_npu_config(monkeypatch):
    monkeypatch.setattr(npu_config_mod, "_current", NPUConfig())


# ------------------------------------------------------------------------------ harness


@dataclass
class Req:
    blocks: list[int]
    k: torch.Tensor      # [len, Hkv, D] logical history
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[0]


class Harness:
    def __init__(self, vllm_config, n, hkv, d, dtype, num_blocks=12, sliding_window=None,
                 seed=0, layout=KVCacheLayout.LHBNC):
        self.n, self.hkv, self.d, self.dtype = n, hkv, d, dtype
        self.scale = 1 / math.sqrt(d)
        self.window = sliding_window
        self.cfg = vllm_config
        self.g = torch.Generator().manual_seed(seed)
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=hkv, head_size=d, dtype=dtype)
        self.builder = NPUAttentionMetadataBuilder(spec, [LAYER], vllm_config,
                                                   torch.device("cpu"))
        self.impl = NPUAttentionImpl(n, d, self.scale, hkv, alibi_slopes=None,
                                     sliding_window=sliding_window, kv_cache_dtype="auto")
        self.layer = SimpleNamespace(layer_name=LAYER)
        self.kv_cache = alloc_kv_cache(num_blocks, hkv, d, dtype, layout)
        # Scrambled free list so requests' blocks are neither ordered nor adjacent.
        self.free = torch.randperm(num_blocks, generator=self.g).tolist()
        self.reqs: list[Req] = []

    def _rand(self, *shape):
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def add_request(self, shared_prefix_of: Req | None = None, shared_blocks: int = 0) -> Req:
        """A new request; with shared_prefix_of, its first shared_blocks blocks (and their
        K/V) are the other request's: a prefix-cache hit, already computed."""
        if shared_prefix_of is None:
            req = Req([], self._rand(0, self.hkv, self.d), self._rand(0, self.hkv, self.d))
        else:
            n_tok = shared_blocks * BS
            assert shared_prefix_of.length >= n_tok
            req = Req(list(shared_prefix_of.blocks[:shared_blocks]),
                      shared_prefix_of.k[:n_tok].clone(), shared_prefix_of.v[:n_tok].clone())
        self.reqs.append(req)
        return req

    def step(self, batch: list[tuple[Req, int]], pad: int = 0):
        """Run one forward over (request, new token count) pairs; return (out, refs)."""
        qs, ks, vs, slots, q_lens, seq_lens = [], [], [], [], [], []
        for req, n_new in batch:
            start = req.length
            while len(req.blocks) * BS < start + n_new:
                req.blocks.append(self.free.pop())
            q = self._rand(n_new, self.n, self.d)
            k = self._rand(n_new, self.hkv, self.d)
            v = self._rand(n_new, self.hkv, self.d)
            slots += [req.blocks[p // BS] * BS + p % BS for p in range(start, start + n_new)]
            qs.append(q)
            ks.append(k)
            vs.append(v)
            q_lens.append(n_new)
            seq_lens.append(start + n_new)
        T = sum(q_lens)
        B = len(batch)
        # Padded tails as a cudagraph-padded batch would have them.
        q_all = torch.cat(qs + [self._rand(pad, self.n, self.d)])
        k_all = torch.cat(ks + [self._rand(pad, self.hkv, self.d)])
        v_all = torch.cat(vs + [self._rand(pad, self.hkv, self.d)])
        slot_mapping = torch.tensor(slots + [-1] * pad, dtype=torch.int64)
        max_blocks = max(len(r.blocks) for r, _ in batch) + 1
        block_table = torch.zeros(B, max_blocks, dtype=torch.int32)
        for b, (req, _) in enumerate(batch):
            block_table[b, :len(req.blocks)] = torch.tensor(req.blocks, dtype=torch.int32)
        qsl = torch.tensor([0] + [sum(q_lens[:b + 1]) for b in range(B)], dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        cm = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl, num_reqs=B,
            num_actual_tokens=T, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
            block_table_tensor=block_table, slot_mapping=slot_mapping,
            seq_lens_cpu_upper_bound=sl.clone())
        meta = self.builder.build(common_prefix_len=0, common_attn_metadata=cm)
        output = torch.full((T + pad, self.n, self.d), 123.0, dtype=self.dtype)
        with set_forward_context({LAYER: meta}, self.cfg):
            self.impl.do_kv_cache_update(self.layer, k_all, v_all, self.kv_cache,
                                         slot_mapping)
            ret = self.impl.forward(self.layer, q_all, k_all, v_all, self.kv_cache, meta,
                                    output)
        assert ret is output
        if pad:
            assert (output[T:] == 123.0).all(), "padding rows were written"
        self.last_queries = qs
        refs = []
        for (req, _), q, k, v in zip(batch, qs, ks, vs, strict=True):
            req.k = torch.cat([req.k, k])
            req.v = torch.cat([req.v, v])
            refs.append(ref_attention(q, req.k, req.v, self.scale, self.window))
        return output[:T], refs

    def check(self, out, refs):
        torch.testing.assert_close(out.float(), torch.cat(refs), **TOL[self.dtype])

    def check_cache_holds_history(self):
        """Every request's logical K/V sits at its slots in the K / V planes."""
        for req in self.reqs:
            for p in range(req.length):
                blk, off = req.blocks[p // BS], p % BS
                assert torch.equal(self.kv_cache[blk, 0, off], req.k[p].flatten())
                assert torch.equal(self.kv_cache[blk, 1, off], req.v[p].flatten())


# ---------------------------------------------------------------------- forward scenarios


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", list(HEADS))
def test_pure_prefill(vllm_config, default_npu_config, heads, dtype):
    n, hkv = HEADS[heads]
    h = Harness(vllm_config, n, hkv, 16, dtype)
    a, b, c = h.add_request(), h.add_request(), h.add_request()
    out, refs = h.step([(a, 130), (b, 5), (c, 128)])
    h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", list(HEADS))
def test_prefill_then_multi_step_decode(vllm_config, decode_op, heads, dtype):
    n, hkv = HEADS[heads]
    h = Harness(vllm_config, n, hkv, 16, dtype, seed=1)
    reqs = [h.add_request() for _ in range(3)]
    out, refs = h.step([(reqs[0], 5), (reqs[1], 127), (reqs[2], 255)])
    h.check(out, refs)
    for _ in range(3):  # 127 -> 128 -> 129 -> 130 crosses a block boundary
        out, refs = h.step([(r, 1) for r in reqs])
        h.check(out, refs)
    h.check_cache_holds_history()


def test_decode_kernel_follows_config(vllm_config, decode_op, mocker):
    h = Harness(vllm_config, 8, 2, 16, torch.float32, seed=2)
    a, b = h.add_request(), h.add_request()
    h.step([(a, 3), (b, 4)])
    pa = mocker.spy(ops, "_npu_paged_attention")
    fia = mocker.spy(ops, "npu_fused_infer_attention_score_out")
    out, refs = h.step([(a, 1), (b, 1)])
    h.check(out, refs)
    expect_paged = decode_op == "paged_attention"
    assert pa.call_count == int(expect_paged)
    assert fia.call_count == int(not expect_paged)
    # A prefill always goes through FIA.
    pa.reset_mock()
    fia.reset_mock()
    c = h.add_request()
    h.step([(c, 2)])
    assert pa.call_count == 0 and fia.call_count == 1


def test_decode_ops_agree(vllm_config, monkeypatch):
    outs = []
    for op in ("paged_attention", "fused_infer_attention"):
        monkeypatch.setattr(npu_config_mod, "_current", NPUConfig(decode_attention_op=op))
        h = Harness(vllm_config, 8, 2, 32, torch.float32, seed=3)  # same seed: same data
        reqs = [h.add_request() for _ in range(4)]
        h.step([(r, n) for r, n in zip(reqs, (127, 128, 129, 257), strict=True)])
        out, refs = h.step([(r, 1) for r in reqs])
        h.check(out, refs)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", list(HEADS))
def test_mixed_prefill_and_decode(vllm_config, decode_op, heads, dtype):
    n, hkv = HEADS[heads]
    h = Harness(vllm_config, n, hkv, 16, dtype, seed=4)
    a, b = h.add_request(), h.add_request()
    h.step([(a, 129), (b, 40)])
    c, d = h.add_request(), h.add_request()
    # Decodes and new prefills interleaved in one batch.
    out, refs = h.step([(a, 1), (c, 20), (b, 1), (d, 131)])
    h.check(out, refs)
    out, refs = h.step([(a, 1), (b, 1), (c, 1), (d, 1)])
    h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_chunked_prefill_attends_to_first_chunk(vllm_config, default_npu_config, dtype):
    h = Harness(vllm_config, 8, 2, 16, dtype, seed=5)
    a = h.add_request()
    out1, refs1 = h.step([(a, 200)])
    h.check(out1, refs1)
    out2, refs2 = h.step([(a, 100)])  # second chunk: q=100, kv=300
    h.check(out2, refs2)
    # The first chunk matters: attending to the second chunk alone gives another answer.
    q2 = h.last_queries[0]
    no_prefix = ref_attention(q2, a.k[200:], a.v[200:], h.scale)
    assert not torch.allclose(out2.float(), no_prefix, atol=0.1)


def test_chunked_equals_unchunked(vllm_config, default_npu_config, monkeypatch):
    """Same queries/keys through one 300-token prefill vs 200 + 100 chunks."""
    torch_gen = torch.Generator().manual_seed(7)
    n, hkv, d, T = 8, 2, 16, 300
    q = torch.randn(T, n, d, generator=torch_gen)
    k = torch.randn(T, hkv, d, generator=torch_gen)
    v = torch.randn(T, hkv, d, generator=torch_gen)

    def run(chunks):
        h = Harness(vllm_config, n, hkv, d, torch.float32, seed=8)
        req = h.add_request()
        outs, at = [], 0
        for c in chunks:
            feed = iter([q[at:at + c], k[at:at + c], v[at:at + c]])

            def fixed(*shape, feed=feed):  # step() draws q, k, v, then empty padding
                return next(feed) if shape[0] else torch.zeros(shape)

            monkeypatch.setattr(h, "_rand", fixed)
            out, refs = h.step([(req, c)])
            h.check(out, refs)
            outs.append(out.clone())
            at += c
        return torch.cat(outs)

    one = run([300])
    two = run([200, 100])
    three = run([1, 127, 172])
    torch.testing.assert_close(two, one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(three, one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_cache_hit_shares_physical_block(vllm_config, decode_op, dtype):
    h = Harness(vllm_config, 8, 2, 16, dtype, seed=9)
    a = h.add_request()
    h.step([(a, 140)])
    # b reuses a's first (full) block: 128 tokens computed, only its suffix is new.
    b = h.add_request(shared_prefix_of=a, shared_blocks=1)
    assert b.blocks[0] == a.blocks[0]
    out, refs = h.step([(b, 30)])
    h.check(out, refs)
    assert b.blocks[1] != a.blocks[1]
    # Both keep decoding; b's writes must not disturb a's private block and vice versa.
    for _ in range(2):
        out, refs = h.step([(a, 1), (b, 1)])
        h.check(out, refs)
    h.check_cache_holds_history()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("window", [1, 16, 128])
def test_sliding_window(vllm_config, default_npu_config, window, dtype):
    h = Harness(vllm_config, 8, 2, 16, dtype, sliding_window=window, seed=10)
    assert h.impl.use_paged_decode is False  # paged attention has no window
    a, b = h.add_request(), h.add_request()
    out, refs = h.step([(a, 150), (b, 20)])
    h.check(out, refs)
    c = h.add_request()
    out, refs = h.step([(a, 1), (c, 40), (b, 1)])
    h.check(out, refs)
    for _ in range(2):
        out, refs = h.step([(a, 1), (b, 1), (c, 1)])
        h.check(out, refs)


def test_sliding_window_differs_from_full_attention(vllm_config, default_npu_config):
    # Guard that the window really is applied: same data, with and without a window.
    h_full = Harness(vllm_config, 4, 2, 16, torch.float32, seed=11)
    h_win = Harness(vllm_config, 4, 2, 16, torch.float32, sliding_window=8, seed=11)
    outs = []
    for h in (h_full, h_win):
        r = h.add_request()
        out, refs = h.step([(r, 50)])
        h.check(out, refs)
        outs.append(out)
    torch.testing.assert_close(outs[0][:8], outs[1][:8], atol=1e-6, rtol=0)
    assert not torch.allclose(outs[0][8:], outs[1][8:], atol=1e-3)


@pytest.mark.parametrize("pad", [1, 7])
def test_padded_tokens_are_ignored(vllm_config, decode_op, pad):
    h = Harness(vllm_config, 4, 1, 16, torch.float32, seed=12)
    a, b = h.add_request(), h.add_request()
    out, refs = h.step([(a, 10), (b, 3)], pad=pad)  # pad slots are -1: must not be written
    h.check(out, refs)
    out, refs = h.step([(a, 1), (b, 1)], pad=pad)
    h.check(out, refs)
    h.check_cache_holds_history()


@pytest.fixture
def paired_config():
    """A hybrid model's resolved layout: block-compact pages (kv_layout.paired_planes)."""
    config = VllmConfig()
    config.cache_config.kv_cache_layout = "LBHNC"
    return config


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_block_compact_pages_give_the_same_attention(paired_config, decode_op, dtype):
    """LBHNC pages (K rows then V rows per block, as pools shared with Mamba state hold
    them) through prefill, a prefix-cache hit, mixed batches and decodes: the same
    attention as dense math, every token's K and V in its own block's page."""
    h = Harness(paired_config, 4, 2, 32, dtype, layout=KVCacheLayout.LBHNC)
    assert h.kv_cache.is_contiguous() and not h.kv_cache[:, 0].is_contiguous()
    a = h.add_request()
    h.check(*h.step([(a, 2 * BS + 5)]))
    b = h.add_request(shared_prefix_of=a, shared_blocks=2)
    h.check(*h.step([(a, 1), (b, 7)]))
    for _ in range(3):
        h.check(*h.step([(a, 1), (b, 1)], pad=3))
    h.check_cache_holds_history()


def test_block_compact_metadata_addresses_half_pages(paired_config, default_npu_config):
    """Block b's K and V half-pages sit at index 2b of the K and V caches the ops take:
    the builder doubles block ids and moves slots to the K half-page of their block."""
    h = Harness(paired_config, 4, 2, 32, torch.float32, layout=KVCacheLayout.LBHNC)
    k_cache, v_cache = h.impl._cache_views(h.kv_cache)[:2]
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache[6].data_ptr() == h.kv_cache[3, 0].data_ptr()
    assert v_cache[6].data_ptr() == h.kv_cache[3, 1].data_ptr()
    table = torch.tensor([[3, 5]], dtype=torch.int32)
    slots = torch.tensor([3 * BS + 7, 5 * BS, -1], dtype=torch.int64)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=torch.tensor([2]),
        num_reqs=1, num_actual_tokens=2, max_query_len=2, max_seq_len=2,
        block_table_tensor=table, slot_mapping=slots[:2],
        seq_lens_cpu_upper_bound=torch.tensor([2]))
    meta = h.builder.build(common_prefix_len=0, common_attn_metadata=cm)
    assert meta.block_table.tolist() == [[6, 10]]
    assert meta.slot_mapping.tolist() == [6 * BS + 7, 10 * BS]
    assert table.tolist() == [[3, 5]], "vLLM's own block table was changed"


# ---------------------------------------------------------------- cache update / layout


def test_kv_cache_update_writes_k_and_v_planes(vllm_config, default_npu_config):
    hkv, d = 2, 16
    h = Harness(vllm_config, 4, hkv, d, torch.float32, num_blocks=3, seed=13)
    # LHBNC: each plane is one contiguous [num_blocks, BS, Hkv*D] tensor.
    assert h.kv_cache[:, 0].is_contiguous() and h.kv_cache[:, 1].is_contiguous()
    a = h.add_request()
    h.step([(a, 130)])
    for p in (0, 127, 128, 129):
        blk, off = a.blocks[p // BS], p % BS
        assert torch.equal(h.kv_cache[blk, 0, off].view(hkv, d), a.k[p])
        assert torch.equal(h.kv_cache[blk, 1, off].view(hkv, d), a.v[p])
    # Nothing else was written: the third block stays zero.
    unused = (set(range(3)) - set(a.blocks)).pop()
    assert not h.kv_cache[unused].any()
    # Offsets past the request in its last block also stay zero.
    assert not h.kv_cache[a.blocks[1], :, 2:].any()


def test_kv_cache_update_without_metadata_is_noop(vllm_config, default_npu_config):
    h = Harness(vllm_config, 4, 2, 16, torch.float32, num_blocks=2)
    k = torch.ones(3, 2, 16)
    with set_forward_context(None, vllm_config):
        h.impl.do_kv_cache_update(h.layer, k, k, h.kv_cache,
                                  torch.tensor([0, 1, 2], dtype=torch.int64))
    with set_forward_context({"some.other.layer": None}, vllm_config):
        h.impl.do_kv_cache_update(h.layer, k, k, h.kv_cache,
                                  torch.tensor([0, 1, 2], dtype=torch.int64))
    assert not h.kv_cache.any()
    out = torch.full((3, 4, 16), 5.0)
    assert h.impl.forward(h.layer, torch.ones(3, 4, 16), k, k, h.kv_cache, None, out) is out
    assert (out == 5.0).all()


def test_kv_sharing_layer_does_not_write(vllm_config, default_npu_config):
    h = Harness(vllm_config, 4, 2, 16, torch.float32, num_blocks=2)
    h.impl = NPUAttentionImpl(4, 16, 0.25, 2, alibi_slopes=None, sliding_window=None,
                              kv_cache_dtype="auto",
                              kv_sharing_target_layer_name="model.layers.0.attn")
    a = h.add_request()
    h.step([(a, 4)])  # output not checked: this layer reads another layer's cache
    assert not h.kv_cache.any()


# --------------------------------------------------------------------- builder metadata


def test_builder_metadata_fields(vllm_config, default_npu_config):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=16, dtype=torch.float16)
    builder = NPUAttentionMetadataBuilder(spec, [LAYER], vllm_config, torch.device("cpu"))
    qsl = torch.tensor([0, 1, 4, 5, 0], dtype=torch.int32)    # one padded request row
    seq = torch.tensor([10, 3, 200, 0], dtype=torch.int32)
    bt = torch.arange(12, dtype=torch.int64).view(4, 3)
    slots = torch.tensor([9, 128, 129, 130, 389, -1, -1], dtype=torch.int64)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=3,
        num_actual_tokens=5, max_query_len=3, max_seq_len=200, block_table_tensor=bt,
        slot_mapping=slots, seq_lens_cpu_upper_bound=seq)
    meta = builder.build(0, cm)
    assert meta.num_actual_tokens == 5 and meta.num_reqs == 3
    assert meta.is_pure_decode is False
    assert meta.query_ends == [1, 4, 5] and isinstance(meta.query_ends, list)
    assert meta.seq_lens_list == [10, 3, 200]
    assert meta.seq_lens.dtype == torch.int32 and meta.seq_lens.device.type == "cpu"
    assert meta.seq_lens.tolist() == [10, 3, 200]
    assert meta.block_table.dtype == torch.int32
    assert meta.block_table.tolist() == bt[:3].tolist()
    assert meta.slot_mapping.dtype == torch.int32
    assert meta.slot_mapping.tolist() == [9, 128, 129, 130, 389]
    assert meta.attn_mask.shape == (2048, 2048) and meta.attn_mask.dtype == torch.bool
    i = torch.arange(2048)
    assert torch.equal(meta.attn_mask, i[None, :] > i[:, None])  # True = masked (future)
    # Without the CPU upper bound the builder falls back to seq_lens.
    cm.seq_lens_cpu_upper_bound = None
    meta2 = builder.build(0, cm)
    assert meta2.seq_lens_list == [10, 3, 200]
    cm.max_query_len = 1
    assert builder.build(0, cm).is_pure_decode is True


# --------------------------------------------------------------------- backend surface


def test_backend_kernel_block_sizes():
    assert NPUAttentionBackend.get_supported_kernel_block_sizes() == [MultipleOf(128)]


@pytest.mark.parametrize("dtype,size", [(torch.float16, 2), (torch.bfloat16, 2),
                                        (torch.float32, 4)])
@pytest.mark.parametrize("hkv,d", [(1, 64), (8, 128)])
def test_backend_customize_spec(dtype, size, hkv, d):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=hkv, head_size=d, dtype=dtype)
    out = NPUAttentionBackend.customize_spec(spec)
    assert out.num_head_slots == 2
    assert out.state_content_bytes == hkv * d * size
    # Same bytes per page as the dense K+V spec: [2, BS, Hkv*D] elements.
    assert out.page_size_bytes == spec.page_size_bytes == 2 * BS * hkv * d * size
    assert NPUAttentionBackend.customize_spec(out) is out  # idempotent


def test_backend_customize_spec_refuses_different_v_head_size():
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, head_size_v=32,
                             dtype=torch.float16)
    with pytest.raises(ValueError, match=r"K head size 64 != V head size 32"):
        NPUAttentionBackend.customize_spec(spec)


def test_backend_properties():
    assert NPUAttentionBackend.supported_kv_cache_layouts() == (KVCacheLayout.LHBNC,
                                                                 KVCacheLayout.LBHNC)
    assert NPUAttentionBackend.supports_attn_type(AttentionType.DECODER)
    for t in (AttentionType.ENCODER, AttentionType.ENCODER_ONLY,
              AttentionType.ENCODER_DECODER):
        assert not NPUAttentionBackend.supports_attn_type(t)
    assert NPUAttentionBackend.supports_sliding_window()
    assert NPUAttentionBackend.get_impl_cls() is NPUAttentionImpl
    assert NPUAttentionBackend.get_builder_cls() is NPUAttentionMetadataBuilder
    sizes = NPUAttentionBackend.get_supported_head_sizes()
    assert 16 in sizes and 128 in sizes and 512 in sizes
    assert 8 not in sizes and 24 not in sizes and 528 not in sizes
    assert NPUAttentionBackend.full_path() == \
        "vllm_npu.attention.backend.NPUAttentionBackend"


# ------------------------------------------------------------------------ impl refusals


def test_impl_refuses_alibi(default_npu_config):
    with pytest.raises(NotImplementedError, match=r"does not support \['alibi_slopes'\]"):
        NPUAttentionImpl(4, 16, 0.25, 2, alibi_slopes=[0.5, 0.25], sliding_window=None,
                         kv_cache_dtype="auto")


def test_impl_takes_sinks_and_soft_caps(default_npu_config):
    """Sinks go to FIA v2 (ATB paged attention takes none), a soft cap to the eager
    composition: neither decodes through paged attention."""
    args = dict(alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto")
    sinks = torch.zeros(4)
    with_sinks = NPUAttentionImpl(4, 16, 0.25, 2, sinks=sinks, **args)
    capped = NPUAttentionImpl(4, 16, 0.25, 2, logits_soft_cap=30.0, **args)
    plain = NPUAttentionImpl(4, 16, 0.25, 2, **args)
    assert with_sinks.sinks is sinks and capped.logits_soft_cap == 30.0
    assert plain.use_paged_decode
    assert not with_sinks.use_paged_decode and not capped.use_paged_decode
    with_sinks.process_weights_after_loading(torch.float32)
    assert with_sinks.sinks is sinks  # float32 beside float32 activations: kept
    half = NPUAttentionImpl(4, 16, 0.25, 2, sinks=torch.ones(4, dtype=torch.float16), **args)
    half.process_weights_after_loading(torch.float16)
    assert half.sinks.dtype == torch.bfloat16  # FIA v2 takes bfloat16 sinks only


@pytest.mark.parametrize("attn_type", [AttentionType.ENCODER, AttentionType.ENCODER_ONLY,
                                       AttentionType.ENCODER_DECODER, "encoder"])
def test_impl_refuses_non_decoder(default_npu_config, attn_type):
    with pytest.raises(NotImplementedError, match=r"decoder attention only, got attn_type=.*"
                                                  r"encoder"):
        NPUAttentionImpl(4, 16, 0.25, 2, alibi_slopes=None, sliding_window=None,
                         kv_cache_dtype="auto", attn_type=attn_type)


def test_impl_refuses_output_quantization(vllm_config, default_npu_config):
    h = Harness(vllm_config, 4, 2, 16, torch.float32, num_blocks=2)
    x = torch.zeros(1, 4, 16)
    with pytest.raises(NotImplementedError, match=r"fused output quantization"):
        h.impl.forward(h.layer, x, x, x, h.kv_cache, None, x, output_scale=torch.ones(1))


def test_impl_reads_decode_op_from_vllm_additional_config(monkeypatch):
    monkeypatch.setattr(npu_config_mod, "_current", None)
    for op, paged in (("fused_infer_attention", False), ("paged_attention", True)):
        cfg = VllmConfig(additional_config={"decode_attention_op": op})
        with set_current_vllm_config(cfg):
            impl = NPUAttentionImpl(4, 16, 0.25, 2, alibi_slopes=None, sliding_window=None,
                                    kv_cache_dtype="auto")
        assert impl.use_paged_decode is paged
