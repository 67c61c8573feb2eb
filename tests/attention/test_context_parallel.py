"""Decode context parallelism of the standard backend, W ranks as W threads in one process.

Each rank has its own KV cache; vLLM's slot mapping (our vectorised override) stores
position p on rank (p // I) % W only. The ranks run builder + cache write + forward in
lockstep, their DCP collectives meet in `ThreadGroup`; every rank's output for its own
query heads must equal dense causal attention over the whole, unsharded history.
"""
from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch
from vllm.config import VllmConfig
from vllm.forward_context import create_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

import vllm_npu.config as npu_config_mod
from tests.helpers.attention import BS, alloc_kv_cache, ref_attention
from vllm_npu import ops
from vllm_npu.attention.backend import NPUAttentionImpl, NPUAttentionMetadataBuilder
from vllm_npu.attention.context_parallel import (
    correct_attn_cp_out,
    gather_sharded_rows,
    merge_partials,
)
from vllm_npu.config import NPUConfig
from vllm_npu.worker.slot_mapping import compute_slot_mapping

LAYER = "model.layers.0.self_attn.attn"
H_LOCAL, D = 2, 16  # query heads per rank; one KV head replicated on every rank (MQA)


class ThreadGroup:
    """A DCP group whose ranks are threads: all_gather concatenates what each put."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.calls = 0

    def rank(self, r: int):
        group = self

        class View:
            world_size, rank_in_group = group.world, r

            def all_gather(self, x, dim=-1):
                group.slots[r] = x
                group.barrier.wait()
                out = torch.cat(group.slots, dim=dim)
                group.barrier.wait()
                group.calls += r == 0
                return out
        return View()


def run_ranks(world, fn):
    errors, threads = [], []

    def wrap(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    for r in range(world):
        threads.append(threading.Thread(target=wrap, args=(r,)))
        threads[-1].start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


@pytest.fixture
def npu_config(monkeypatch):
    monkeypatch.setattr(npu_config_mod, "_current", NPUConfig())


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 16, BS])
def test_dcp_matches_unsharded_attention(npu_config, mocker, world, interleave):
    torch.set_num_threads(1)  # threads stand in for ranks; keep torch from oversubscribing
    g = torch.Generator().manual_seed(world * 1000 + interleave)
    cfg = VllmConfig()
    cfg.parallel_config.decode_context_parallel_size = world
    cfg.parallel_config.cp_kv_cache_interleave_size = interleave
    group = ThreadGroup(world)
    local_group = threading.local()
    mocker.patch("vllm.distributed.get_dcp_group", lambda: local_group.view)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=D, dtype=torch.float32)
    scale = 1 / math.sqrt(D)
    caches = [alloc_kv_cache(8, 1, D, torch.float32) for _ in range(world)]
    impls = []
    for _ in range(world):
        impl = NPUAttentionImpl(H_LOCAL, D, scale, 1, alibi_slopes=None, sliding_window=None,
                                kv_cache_dtype="auto")
        impl.dcp_world_size = world
        impls.append(impl)
    builder = NPUAttentionMetadataBuilder(spec, [LAYER], cfg, torch.device("cpu"))
    vbs = BS * world  # the scheduler's (virtual) block: BS tokens on each rank
    # Requests' virtual blocks (same ids on every rank), histories of full-head K/V.
    blocks = [[3, 0], [5], [1, 6, 2]]
    hist_k = [torch.zeros(0, 1, D) for _ in blocks]
    hist_v = [torch.zeros(0, 1, D) for _ in blocks]
    # Fresh prefills, chunks with cached context, a mixed step, then pure decodes.
    steps = [[(0, 70), (1, 3)], [(0, 200), (1, 40), (2, 1)], [(0, 1), (2, 300), (1, 1)],
             [(0, 1), (1, 1), (2, 1)], [(0, 1), (1, 1), (2, 1)]]
    # Ranks are processes on a device: each has its own forward context (vLLM keeps one
    # per process, a module global), and the merge calls are counted under a lock.
    local_ctx = threading.local()
    mocker.patch("vllm_npu.attention.backend.get_forward_context", lambda: local_ctx.value)
    merges, merges_lock, merge = [0], threading.Lock(), ops.npu_attention_update

    def counted_merge(*args, **kwargs):
        with merges_lock:
            merges[0] += 1
        return merge(*args, **kwargs)

    mocker.patch.object(ops, "npu_attention_update", counted_merge)
    for step in steps:
        reqs = [r for r, _ in step]
        q_lens = [n for _, n in step]
        starts = [hist_k[r].shape[0] for r in reqs]
        assert all(s + n <= len(blocks[r]) * vbs for r, s, n in zip(reqs, starts, q_lens))
        t = sum(q_lens)
        q = torch.randn(t, H_LOCAL * world, D, generator=g)
        k = torch.randn(t, 1, D, generator=g)
        v = torch.randn(t, 1, D, generator=g)
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, q_lens)])
        seq_lens = torch.tensor([s + n for s, n in zip(starts, q_lens)], dtype=torch.int32)
        block_table = torch.zeros(len(reqs), 4, dtype=torch.int32)
        for i, r in enumerate(reqs):
            block_table[i, :len(blocks[r])] = torch.tensor(blocks[r], dtype=torch.int32)
        outs = [None] * world

        def rank_step(rank):
            local_group.view = group.rank(rank)
            slots = torch.empty(t, dtype=torch.int64)
            compute_slot_mapping(t, t, qsl, positions, block_table, block_table.shape[1],
                                 slots, BS, world, rank, interleave)
            cm = CommonAttentionMetadata(
                query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
                num_reqs=len(reqs), num_actual_tokens=t, max_query_len=max(q_lens),
                max_seq_len=int(seq_lens.max()), block_table_tensor=block_table,
                slot_mapping=slots, seq_lens_cpu_upper_bound=seq_lens.clone())
            meta = builder.build(0, cm)
            heads = slice(rank * H_LOCAL, (rank + 1) * H_LOCAL)
            out = torch.zeros(t, H_LOCAL, D)
            layer = SimpleNamespace(layer_name=LAYER)
            local_ctx.value = create_forward_context({LAYER: meta}, cfg)
            impls[rank].do_kv_cache_update(layer, k, v, caches[rank], slots)
            impls[rank].forward(layer, q[:, heads].contiguous(), k, v, caches[rank], meta, out)
            outs[rank] = out

        run_ranks(world, rank_step)
        refs = []
        for i, r in enumerate(reqs):
            hist_k[r] = torch.cat([hist_k[r], k[qsl[i]:qsl[i + 1]]])
            hist_v[r] = torch.cat([hist_v[r], v[qsl[i]:qsl[i + 1]]])
            refs.append(ref_attention(q[qsl[i]:qsl[i + 1]], hist_k[r], hist_v[r], scale))
        ref = torch.cat(refs)
        for rank in range(world):
            heads = slice(rank * H_LOCAL, (rank + 1) * H_LOCAL)
            torch.testing.assert_close(outs[rank], ref[:, heads], atol=1e-5, rtol=1e-5)
    # Every rank stored only its share of each history: position p on (p // I) % W.
    for rank, cache in enumerate(caches):
        stored = int((cache[:, 0].abs().sum(-1) > 0).sum())
        expect = sum(int(((torch.arange(h.shape[0]) // interleave) % world == rank).sum())
                     for h in hist_k)
        assert stored == expect
    # The first step has no cached context: no collectives; later steps gather.
    assert group.calls == 2 * (len(steps) - 1)
    assert merges[0] == world * 2 * (len(steps) - 1)


def test_merge_of_disjoint_key_sets_is_full_softmax():
    """merge_partials over random key splits (some empty for some rows) = one softmax."""
    g = torch.Generator().manual_seed(7)
    t, h, kl = 5, 3, 40
    q, k, v = (torch.randn(t, h, D, generator=g), torch.randn(kl, h, D, generator=g),
               torch.randn(kl, h, D, generator=g))
    scores = torch.einsum("thd,khd->thk", q, k)
    full = torch.einsum("thk,khd->thd", scores.softmax(-1), v)
    owner = torch.randint(0, 3, (kl,), generator=g)
    owner[owner == 2] = 0  # part 2 gets no keys: lse -inf, output 0
    outs, lses = [], []
    for part in range(3):
        s = scores.masked_fill(owner != part, float("-inf"))
        lse = torch.logsumexp(s, -1)
        outs.append(torch.einsum("thk,khd->thd", torch.exp(s - lse[..., None]).nan_to_num(0),
                                 v))
        lses.append(lse)
    out, lse = merge_partials(outs, lses)
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)


def test_sliding_window_with_dcp_is_refused(mocker):
    mocker.patch("vllm.distributed.parallel_state.get_dcp_world_size_and_rank",
                 return_value=(2, 0))
    with pytest.raises(NotImplementedError, match="sliding window.*decode-context-parallel"):
        NPUAttentionImpl(4, D, 0.25, 1, alibi_slopes=None, sliding_window=32,
                         kv_cache_dtype="auto")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 16, BS])
def test_gather_sharded_rows_restores_position_order(world, interleave):
    """MLA prefill under DCP: each rank's local rows of each request -> full contexts."""
    torch.set_num_threads(1)
    lens = [0, 5, 130, 300, 1]
    full = [torch.arange(n * 3, dtype=torch.float32).view(n, 3) + 1000 * r
            for r, n in enumerate(lens)]
    group = ThreadGroup(world)
    results = [None] * world

    def rank_fn(rank):
        local = [rows[(torch.arange(len(rows)) // interleave) % world == rank]
                 for rows in full]
        results[rank] = gather_sharded_rows(group.rank(rank), local, lens, interleave)

    run_ranks(world, rank_fn)
    for got in results:
        for rows, ref in zip(got, full, strict=True):
            assert torch.equal(rows, ref)
    assert group.calls == 1


@pytest.mark.parametrize("is_base_e", [True, False])
def test_cp_correction_kernel_override_through_vllm(is_base_e):
    """vLLM's `correct_attn_out` (its MLA layer's DCP combine) launches our override:
    merged lse = log-sum-exp over ranks; out scaled by exp(own lse - merged), empty
    shards (-inf / NaN) weigh 0."""
    from vllm.v1.attention.ops.dcp import CorrectAttnCPOutKernel, correct_attn_out

    from vllm_npu.kernel_overrides import register_kernel_overrides

    register_kernel_overrides()
    g = torch.Generator().manual_seed(5)
    n, b, h, d = 3, 4, 2, 8
    lses = torch.randn(n, b, h, generator=g)
    lses[1, 0] = float("-inf")           # rank 1 holds nothing of token 0
    lses[:, 3, 1] = float("-inf")        # no rank holds anything of (token 3, head 1)
    lses[2, 2, 0] = float("nan")
    out = torch.randn(b, h, d, generator=g)
    expect_in = out.clone()
    corrected, lse = correct_attn_out(out, lses, 1, None, is_lse_base_on_e=is_base_e)
    clean = torch.where(torch.isnan(lses), float("-inf"), lses)
    scale = 1.0 if is_base_e else math.log(2.0)
    ref_lse = torch.logsumexp(clean * scale, 0) / scale
    factor = torch.exp((clean[1] - ref_lse) * scale).nan_to_num(0.0)
    torch.testing.assert_close(lse, ref_lse)
    torch.testing.assert_close(corrected, expect_in * factor[..., None])
    assert (corrected[0] == 0).all() and (corrected[3, 1] == 0).all()
    assert CorrectAttnCPOutKernel.kernel.func is correct_attn_cp_out


# ------------------------------------------------------------- prefill context parallel


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("num_tokens", [1, 2, 5, 7, 64, 65])
def test_pcp_chunks_tile_the_batch(world, num_tokens):
    """Equal chunks of C = ceil(T / P) rows, rank-major: gathering them and keeping the
    first T rows restores the batch; an empty chunk runs the last token as a stand-in."""
    from vllm_npu.attention.prefill_context_parallel import (
        chunk_len,
        pad_rows,
        run_range,
        token_range,
    )

    c = chunk_len(num_tokens, world)
    ranges = [token_range(num_tokens, world, r) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_tokens
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    batch = torch.arange(num_tokens)
    chunks = []
    for r, (start, end) in enumerate(ranges):
        lo, hi = run_range(num_tokens, world, r)
        assert (lo, hi) == ((start, end) if end > start else (num_tokens - 1, num_tokens))
        chunks.append(pad_rows(batch[lo:hi], c))
        assert chunks[-1].shape == (c,)
    assert torch.equal(torch.cat(chunks)[:num_tokens], batch)


def test_pcp_pieces_give_each_query_row_its_causal_keys():
    """Every local query row's right-down causal window (kv_len - q_len + i) ends at the
    row's own position in its request: context + index of the token among new tokens."""
    from vllm_npu.attention.prefill_context_parallel import build_pcp_metadata, token_range

    q_lens, contexts = [1, 5, 2, 6], [40, 0, 130, 7]
    qsl = [0, 1, 6, 8, 14]
    seq = [c + q for c, q in zip(contexts, q_lens)]
    positions = [contexts[r] + i for r, q in enumerate(q_lens) for i in range(q)]
    owner = [r for r, q in enumerate(q_lens) for _ in range(q)]
    for world in (2, 3, 5):
        seen = []
        for rank in range(world):
            m = build_pcp_metadata(qsl, seq, 14, world, rank)
            start, end = token_range(14, world, rank)
            assert m.run == (start, end) and m.chunk == -(-14 // world)
            starts = [0] + m.query_ends[:-1]
            for s, e, kv, r, pre in zip(starts, m.query_ends, m.kv_lens, m.rows.tolist(),
                                        m.prefilling.tolist()):
                assert pre == (q_lens[r] > 1)
                for i in range(e - s):
                    token = start + s + i
                    assert owner[token] == r
                    assert kv - (e - s) + i == positions[token]  # last key it may see
                    seen.append(token)
        assert seen == list(range(14))  # the ranks' pieces cover the batch once, in order
