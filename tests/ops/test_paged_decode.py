"""The in-place paged decode kernel (`ops/sim/paged_decode.py`) and the padded row groups
of FIA's multi-token rows, against float64 references computed here from each request's
logical K/V (never from the paged cache)."""
from __future__ import annotations

import math

import pytest
import torch

from vllm_npu.ops.sim import npu_fused_infer_attention_score
from vllm_npu.ops.sim.attention import row_groups
from vllm_npu.ops.sim.paged_decode import paged_decode, paged_rows, supports

BS = 128


def _paged(logical: list[torch.Tensor], num_blocks: int, seed: int, bs: int = BS):
    """Scatter each request's [len, H, D] rows into a shuffled paged cache."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_blocks, generator=g).tolist()  # first: same seed, same blocks
    h, d = logical[0].shape[1:]
    cache = torch.randn(num_blocks, bs, h, d, generator=g).to(logical[0].dtype)
    width = max(-(-len(x) // bs) for x in logical)
    table = torch.zeros(len(logical), max(width, 1), dtype=torch.int32)
    for b, rows in enumerate(logical):
        for c in range(-(-len(rows) // bs)):
            blk = free.pop()
            table[b, c] = blk
            part = rows[c * bs:(c + 1) * bs]
            cache[blk, :len(part)] = part
    return cache, table


def _reference(q, keys, values, scale, window=None, q_rope=None, k_rope=None):
    """Per request, float64: softmax over the visible keys, then values."""
    out, lse = [], []
    n_heads = q.shape[1]
    for b, (k, v) in enumerate(zip(keys, values)):
        lo = 0 if window is None else max(0, len(k) - 1 - window)
        k, v = k[lo:].double(), v[lo:].double()
        if len(k) == 0:
            out.append(torch.zeros(n_heads, v.shape[-1], dtype=torch.float64))
            lse.append(torch.full((n_heads,), -math.inf, dtype=torch.float64))
            continue
        group = n_heads // k.shape[1]
        kk = k.repeat_interleave(group, dim=1)  # [L, N, D]
        scores = torch.einsum("nd,lnd->nl", q[b].double(), kk)
        if q_rope is not None:
            kr = k_rope[b][lo:].double().repeat_interleave(group, dim=1)
            scores += torch.einsum("nd,lnd->nl", q_rope[b].double(), kr)
        scores *= scale
        lse.append(torch.logsumexp(scores, -1))
        probs = torch.softmax(scores, -1)
        out.append(torch.einsum("nl,lnd->nd", probs, v.repeat_interleave(group, dim=1)))
    return torch.stack(out), torch.stack(lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 32), (8, 2, 64), (16, 1, 128)])
@pytest.mark.parametrize("window", [None, 5, 300])
def test_decode_matches_reference(dtype, heads, kv_heads, dim, window):
    lens = [1, 127, 128, 129, 300, 517, 0, 64]
    g = torch.Generator().manual_seed(heads + dim)
    keys = [torch.randn(n, kv_heads, dim, generator=g).to(dtype) for n in lens]
    values = [torch.randn(n, kv_heads, dim, generator=g).to(dtype) for n in lens]
    k_cache, table = _paged(keys, 48, seed=1)
    v_cache, _ = _paged(values, 48, seed=1)  # same seed: the same block for each row
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    scale = 1 / math.sqrt(dim)
    out, lse = paged_decode(q, k_cache, v_cache, kv_heads, table, torch.tensor(lens), scale,
                            window)
    ref_out, ref_lse = _reference(q, keys, values, scale, window)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_out, **tol)
    torch.testing.assert_close(lse.double(), ref_lse.float().double(), atol=1e-5, rtol=1e-5)
    assert out[6].abs().sum() == 0 and lse[6].eq(-math.inf).all()  # no key: zero, -inf


@pytest.mark.parametrize("kv_heads,dim,dim_v,bs", [(2, 32, 32, 24), (8, 128, 128, 16),
                                                  (1, 64, 32, 40), (3, 16, 48, 7)])
def test_float32_decode_layouts_match_reference(kv_heads, dim, dim_v, bs):
    """float32 rows run in one pass over chunks of 16 keys (csrc/sim_decode.c), except
    token rows 4 KiB apart (8 x 128: the two-pass kernel): chunks that cross blocks of
    24 / 40 / 7 tokens, value rows narrower or wider than keys, windows that start a
    chunk mid-block."""
    lens = [1, 15, 16, 17, 200, 333, 48]
    g = torch.Generator().manual_seed(dim + bs)
    heads = kv_heads * 3
    keys = [torch.randn(n, kv_heads, dim, generator=g) for n in lens]
    values = [torch.randn(n, kv_heads, dim_v, generator=g) for n in lens]
    k_cache, table = _paged(keys, 128, seed=4, bs=bs)
    v_cache, _ = _paged(values, 128, seed=4, bs=bs)
    q = torch.randn(len(lens), heads, dim, generator=g)
    for window in (None, 21):
        out, lse = paged_decode(q, k_cache, v_cache, kv_heads, table, torch.tensor(lens),
                                0.17, window)
        ref_out, ref_lse = _reference(q, keys, values, 0.17, window)
        torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_decode_with_rope_planes_matches_reference():
    """The MLA form: scores add q_rope . k_rope, values are the nope plane."""
    lens = [3, 200, 129]
    g = torch.Generator().manual_seed(7)
    nope = [torch.randn(n, 1, 32, generator=g) for n in lens]
    rope = [torch.randn(n, 1, 16, generator=g) for n in lens]
    n_cache, table = _paged(nope, 12, seed=3)
    r_cache, _ = _paged(rope, 12, seed=3)
    q = torch.randn(3, 8, 32, generator=g)
    q_rope = torch.randn(3, 8, 16, generator=g)
    out, lse = paged_decode(q, n_cache, n_cache, 1, table, torch.tensor(lens), 0.2,
                            query_rope=q_rope, key_rope=r_cache)
    ref_out, ref_lse = _reference(q, nope, nope, 0.2, q_rope=q_rope, k_rope=rope)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_decode_reads_only_the_table_blocks():
    """Rows past kv_len and blocks outside a request's table never reach its output."""
    keys = [torch.randn(130, 2, 32)]
    values = [torch.randn(130, 2, 32)]
    k_cache, table = _paged(keys, 6, seed=5)
    v_cache, _ = _paged(values, 6, seed=5)
    q = torch.randn(1, 2, 32)
    before = paged_decode(q, k_cache, v_cache, 2, table, torch.tensor([130]), 0.1)[0]
    poisoned_k, poisoned_v = k_cache.clone(), v_cache.clone()
    others = [b for b in range(6) if b not in table[0].tolist()]
    poisoned_k[others] = float("nan")
    poisoned_v[others] = float("nan")
    last = int(table[0, 1])
    poisoned_k[last, 2:] = float("nan")  # past token 129
    poisoned_v[last, 2:] = float("nan")
    after = paged_decode(q, poisoned_k, poisoned_v, 2, table, torch.tensor([130]), 0.1)[0]
    assert torch.equal(before, after)


def test_float16_caches_are_left_to_the_dense_path():
    assert supports(torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.float32))
    assert supports(torch.zeros(1, dtype=torch.bfloat16))
    assert not supports(torch.zeros(1, dtype=torch.float16))
    assert not supports(torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.bfloat16))


def test_fia_mixed_batch_decode_rows_and_prefill_rows():
    """One FIA call with decode rows and prefills of several lengths: float32 reads every
    row in place (the kernel's single rows and prefill tiles), float16 runs the dense path
    (decode rows as one padded batch, prefills in padded groups): equal to the
    reference."""
    q_lens = [1, 40, 1, 40, 7, 300, 1]
    kv_lens = [150, 40, 9, 60, 7, 300, 260]
    for dtype in (torch.float32, torch.float16):
        g = torch.Generator().manual_seed(11)
        keys = [torch.randn(n, 2, 64, generator=g).to(dtype) for n in kv_lens]
        values = [torch.randn(n, 2, 64, generator=g).to(dtype) for n in kv_lens]
        k_cache, table = _paged(keys, 40, seed=9)
        v_cache, _ = _paged(values, 40, seed=9)
        T = sum(q_lens)
        q = torch.randn(T, 4, 64, generator=g).to(dtype)
        ends = torch.tensor(q_lens).cumsum(0).tolist()
        out, _ = npu_fused_infer_attention_score(
            q, k_cache.view(40, BS, -1), v_cache.view(40, BS, -1),
            atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
            actual_seq_lengths=ends, actual_seq_lengths_kv=kv_lens, block_table=table,
            num_heads=4, num_key_value_heads=2, scale=0.125, input_layout="TND",
            sparse_mode=3, block_size=BS)
        start = 0
        for b, (nq, nk) in enumerate(zip(q_lens, kv_lens)):
            k = keys[b].double().repeat_interleave(2, dim=1)
            v = values[b].double().repeat_interleave(2, dim=1)
            scores = torch.einsum("qnd,knd->nqk", q[start:start + nq].double(), k) * 0.125
            causal = torch.arange(nk).view(1, -1) <= torch.arange(nq).view(-1, 1) + nk - nq
            probs = torch.softmax(scores.masked_fill(~causal, -math.inf), -1)
            ref = torch.einsum("nqk,knd->qnd", probs, v)
            tol = 1e-5 if dtype == torch.float32 else 3e-3
            torch.testing.assert_close(out[start:start + nq].double(), ref, atol=tol, rtol=tol)
            start += nq


def test_row_groups_batch_equal_rows_and_bound_padding():
    rows = list(range(6))
    assert row_groups(rows, [128] * 6, [128] * 6) == [[0, 1, 2, 3, 4, 5]]
    q_lens = [2000, 10, 10, 12, 9]
    kv_lens = [2000, 10, 10, 12, 9]
    groups = row_groups(list(range(5)), q_lens, kv_lens)
    assert groups[0] == [0]  # a long prompt runs alone
    assert sorted(b for grp in groups for b in grp) == list(range(5))
    for grp in groups:
        padded = len(grp) * max(q_lens[b] for b in grp) * max(kv_lens[b] for b in grp)
        assert padded <= 1.25 * sum(q_lens[b] * kv_lens[b] for b in grp)
    assert len(groups) == 3  # [2000], then the short rows two by two
    assert row_groups([], [], []) == []


def test_decode_leaves_the_cache_resizable():
    """Sleep mode frees the KV cache with an in-place storage resize; `Tensor.numpy()`
    would have pinned the storage for good."""
    k, v = torch.randn(4, BS, 2, 32), torch.randn(4, BS, 2, 32)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    paged_decode(torch.randn(2, 4, 32), k, v, 2, table, torch.tensor([5, 7]), 0.1)
    for cache in (k, v, table):
        cache.untyped_storage().resize_(0)
        assert cache.untyped_storage().nbytes() == 0


def test_fia_batch_of_equal_prompts_is_plain_causal_attention():
    """Three whole prompts of one length share one padded call (the unmasked causal
    kernel); each row equals its own causal softmax."""
    g = torch.Generator().manual_seed(4)
    n, length = 3, 50
    q = torch.randn(n * length, 4, 128, generator=g)  # the dense TND form's D
    k = torch.randn(n * length, 2, 128, generator=g)
    v = torch.randn(n * length, 2, 128, generator=g)
    ends = [length * (i + 1) for i in range(n)]
    out, _ = npu_fused_infer_attention_score(
        q, k, v, atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        actual_seq_lengths=ends, actual_seq_lengths_kv=ends, num_heads=4,
        num_key_value_heads=2, scale=0.2, input_layout="TND", sparse_mode=3)
    assert len(row_groups(list(range(n)), [length] * n, [length] * n)) == 1
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for i in range(n):
        rows = slice(i * length, (i + 1) * length)
        kk = k[rows].double().repeat_interleave(2, dim=1)
        vv = v[rows].double().repeat_interleave(2, dim=1)
        scores = torch.einsum("qnd,knd->nqk", q[rows].double(), kk) * 0.2
        probs = torch.softmax(scores.masked_fill(~causal, -math.inf), -1)
        torch.testing.assert_close(out[rows].double(), torch.einsum("nqk,knd->qnd", probs, vv),
                                   atol=1e-5, rtol=1e-5)


def _batch(n_req: int, heads: int, kv_heads: int, dim: int, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 400, (n_req,), generator=g).tolist()
    keys = [torch.randn(n, kv_heads, dim, generator=g).to(dtype) for n in lens]
    values = [torch.randn(n, kv_heads, dim, generator=g).to(dtype) for n in lens]
    blocks = sum(-(-n // BS) for n in lens) + 3
    k_cache, table = _paged(keys, blocks, seed=seed)
    v_cache, _ = _paged(values, blocks, seed=seed)
    q = torch.randn(n_req, heads, dim, generator=g).to(dtype)
    return q, keys, values, k_cache, v_cache, table, torch.tensor(lens)


def _without_team(monkeypatch) -> None:
    """As under a torch without GNU OpenMP: the team entry answers -3, the kernel's own
    pool runs."""
    from vllm_npu.ops.sim import paged_decode as pd

    entry = pd._entry
    monkeypatch.setattr(pd, "_entry", lambda name: (lambda *a: pd._NO_TEAM)
                        if name == "npu_sim_paged_decode_team" else entry(name))


def test_results_do_not_depend_on_the_kernel_threads(monkeypatch):
    """A batch large enough to be split over threads: 1, 2 and 5 threads, on torch's
    OpenMP team and on the kernel's own pool, give bit-identical results (each request
    is computed by one thread), equal to the reference."""
    from vllm_npu.ops.sim import paged_decode as pd

    q, keys, values, k_cache, v_cache, table, lens = _batch(96, 8, 2, 64, seed=21)
    results = []
    for pool in (False, True):
        if pool:
            _without_team(monkeypatch)
        for n in (1, 2, 5):
            monkeypatch.setattr(pd.cores, "device_cores", lambda n=n: n)
            results.append(paged_decode(q, k_cache, v_cache, 2, table, lens, 0.125))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    ref_out, ref_lse = _reference(q, keys, values, 0.125)
    torch.testing.assert_close(results[0][0].double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[0][1].double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_out_is_written_in_place_and_lse_can_be_skipped():
    """`out=` (the decode ops pass their own output) receives the result without a copy;
    without want_lse no lse is made; a wrong-shaped or non-float32 `out` is not written."""
    q, keys, values, k_cache, v_cache, table, lens = _batch(9, 4, 2, 32, seed=5)
    ref, _ = paged_decode(q, k_cache, v_cache, 2, table, lens, 0.2)
    out = torch.full_like(ref, float("nan"))
    got, lse = paged_decode(q, k_cache, v_cache, 2, table, lens, 0.2, out=out, want_lse=False)
    assert got is out and lse is None and torch.equal(out, ref)
    for wrong in (torch.zeros(9, 4, 16), torch.zeros(9, 4, 32, dtype=torch.float64)):
        got, _ = paged_decode(q, k_cache, v_cache, 2, table, lens, 0.2, out=wrong)
        assert got is not wrong and torch.equal(got, ref) and not wrong.any()


def test_concurrent_callers_each_get_their_own_result():
    import threading

    batches = [_batch(40, 4, 2, 32, seed=s) for s in (31, 32, 33)]
    outs = [None] * len(batches)

    def run(i):
        q, _, _, k_cache, v_cache, table, lens = batches[i]
        for _ in range(5):
            outs[i] = paged_decode(q, k_cache, v_cache, 2, table, lens, 0.2)[0]

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for (q, keys, values, *_), out in zip(batches, outs):
        torch.testing.assert_close(out.double(), _reference(q, keys, values, 0.2)[0],
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_sizes_not_a_multiple_of_eight(dtype):
    """Rows are widened and zero-padded to the kernel's 8-float steps: D = 20 with a
    12-wide rope plane, and D = 36 without one."""
    g = torch.Generator().manual_seed(8)
    lens = [3, 130, 257]
    nope = [torch.randn(n, 1, 20, generator=g).to(dtype) for n in lens]
    rope = [torch.randn(n, 1, 12, generator=g).to(dtype) for n in lens]
    n_cache, table = _paged(nope, 12, seed=2)
    r_cache, _ = _paged(rope, 12, seed=2)
    q, q_rope = torch.randn(3, 6, 20, generator=g).to(dtype), \
        torch.randn(3, 6, 12, generator=g).to(dtype)
    out, lse = paged_decode(q, n_cache, n_cache, 1, table, torch.tensor(lens), 0.3,
                            query_rope=q_rope, key_rope=r_cache)
    ref_out, ref_lse = _reference(q, nope, nope, 0.3, q_rope=q_rope, k_rope=rope)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)

    q, keys, values, k_cache, v_cache, table, lens = _batch(5, 4, 2, 36, seed=3, dtype=dtype)
    out, _ = paged_decode(q, k_cache, v_cache, 2, table, lens, 0.2)
    torch.testing.assert_close(out.double(), _reference(q, keys, values, 0.2)[0], **tol)


def test_block_ids_outside_the_cache_and_short_tables_are_refused():
    k, v = torch.randn(4, BS, 2, 32), torch.randn(4, BS, 2, 32)
    q = torch.randn(2, 4, 32)
    with pytest.raises(ValueError, match=r"block id outside \[0, 4\)"):
        paged_decode(q, k, v, 2, torch.tensor([[0], [7]], dtype=torch.int32),
                     torch.tensor([5, 7]), 0.1)
    with pytest.raises(ValueError, match=r"past its block table row \(1 blocks of 128\)"):
        paged_decode(q, k, v, 2, torch.tensor([[0], [1]], dtype=torch.int32),
                     torch.tensor([5, 129]), 0.1)


def test_without_the_native_library_the_callers_use_the_dense_path(monkeypatch):
    """An install without a C compiler has no kernel library: `supports` says no and ATB
    paged attention computes the same result through gather + SDPA."""
    from vllm_npu.ops.sim import paged_decode as pd
    from vllm_npu.ops.sim.attention import _npu_paged_attention

    q, keys, values, k_cache, v_cache, table, lens = _batch(6, 4, 2, 32, seed=12)
    ref = _reference(q, keys, values, 0.25)[0]
    for kernel, native in ((pd._kernel, True), (lambda: None, False)):
        monkeypatch.setattr(pd, "_kernel", kernel)
        assert pd.supports(k_cache, v_cache) is native
        out = torch.empty_like(q)
        _npu_paged_attention(q, k_cache, v_cache, 2, 4, 0.25, table, lens.int(), out)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_device_cores_come_from_the_environment_or_the_host_share(monkeypatch):
    import os

    from vllm_npu.ops.sim import cores

    cpus = len(os.sched_getaffinity(0))
    try:
        monkeypatch.setenv("NPU_SIM_CORES", "3")
        cores.set_ranks_on_host(4)
        assert cores.device_cores() == 3
        monkeypatch.delenv("NPU_SIM_CORES")
        cores.set_ranks_on_host(1)
        assert cores.device_cores() == cpus
        cores.set_ranks_on_host(cpus * 2)  # more ranks than CPUs: one core each
        assert cores.device_cores() == 1
        monkeypatch.setenv("NPU_SIM_CORES", "0")
        cores.set_ranks_on_host(1)
        with pytest.raises(ValueError, match=r"NPU_SIM_CORES='0' must be > 0"):
            cores.device_cores()
    finally:
        monkeypatch.delenv("NPU_SIM_CORES", raising=False)
        cores.set_ranks_on_host(1)


def test_device_compute_threads_restore_the_host_setting(monkeypatch):
    import torch

    from vllm_npu.ops.sim import cores

    original = torch.get_num_threads()
    monkeypatch.setenv("NPU_SIM_CORES", "2")
    cores.device_cores.cache_clear()
    try:
        torch.set_num_threads(1)  # vLLM's serving setting
        with cores.device_compute_threads():
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(original)
        monkeypatch.delenv("NPU_SIM_CORES")
        cores.device_cores.cache_clear()


class _NotCalled:
    """A kernel entry that must not run (its presence still says the library loaded)."""

    def __call__(self, *args):
        raise AssertionError("the kernel's own pool ran where torch's OpenMP team was there")


@pytest.mark.parametrize("heads,kv_heads,dim,dim_v", [(4, 2, 32, 32), (8, 1, 40, 48),
                                                      (16, 2, 64, 16), (3, 3, 24, 64)])
def test_prefill_rows_match_reference_for_any_key_limits(heads, kv_heads, dim, dim_v,
                                                         monkeypatch):
    """Rows of several requests (runs of one request become tiles of the prefill kernel:
    query heads per KV head 1..8, key dims not a multiple of 16, value dims of one to four
    vectors), each row with its own key range [first, lens): causal, banded, empty, all
    keys. Equal to a float64 softmax over exactly those keys, with the same result for 1
    and 3 threads of the kernel's own pool and on torch's OpenMP team (a tile is one
    thread's work). Rows of up to 1,100 keys span several of the kernel's softmax spans.
    """
    from vllm_npu.ops.sim import paged_decode as pd

    g = torch.Generator().manual_seed(heads * 100 + dim)
    kv_lens = [300, 45, 1, 129, 1100, 260]
    keys = [torch.randn(n, kv_heads, dim, generator=g) for n in kv_lens]
    values = [torch.randn(n, kv_heads, dim_v, generator=g) for n in kv_lens]
    k_cache, table = _paged(keys, 24, seed=5)
    v_cache, _ = _paged(values, 24, seed=5)
    q_lens = [70, 45, 1, 33, 30, 20]
    row_of = torch.repeat_interleave(torch.arange(6), torch.tensor(q_lens))
    pos = torch.cat([torch.arange(kv - q, kv) for q, kv in zip(q_lens, kv_lens)])
    lens = pos + 1  # causal
    first = torch.zeros_like(lens)
    first[:70] = (pos[:70] - 37).clamp(min=0)  # request 0: a band of 38 keys
    lens[70:80] = 0  # request 1: ten rows see no key
    # request 4: keys over several of the kernel's softmax spans (512), ten rows a band
    # of 600 keys that starts inside one span and ends in another
    first[149:159] = pos[149:159] - 599
    lens[-20:] = kv_lens[-1]  # request 5: every key
    q = torch.randn(len(row_of), heads, dim, generator=g)
    results = []
    with monkeypatch.context() as patch:  # the kernel's own pool
        _without_team(patch)
        for threads in (1, 3):
            patch.setattr(pd.cores, "device_cores", lambda n=threads: n)
            results.append(paged_rows(q, k_cache, v_cache, kv_heads, table, first, lens,
                                      0.3, row_of=row_of))
    # with more than one core, on torch's OpenMP team (whatever torch's own thread
    # count: a replay keeps one between its matmuls), never the kernel's own pool
    monkeypatch.setattr(pd.cores, "device_cores", lambda: 2)
    monkeypatch.setattr(pd, "_kernel", _NotCalled())
    before = torch.get_num_threads()
    for torch_threads in (1, 2):
        torch.set_num_threads(torch_threads)
        try:
            results.append(paged_rows(q, k_cache, v_cache, kv_heads, table, first, lens,
                                      0.3, row_of=row_of))
        finally:
            torch.set_num_threads(before)
    for other in results[1:]:
        assert torch.equal(results[0][0], other[0]) and torch.equal(results[0][1], other[1])
    out, lse = results[0]
    group = heads // kv_heads
    for r in range(len(row_of)):
        b, lo, hi = int(row_of[r]), int(first[r]), int(lens[r])
        if hi <= lo:
            assert torch.equal(out[r], torch.zeros(heads, dim_v))
            assert torch.isneginf(lse[r]).all()
            continue
        k = keys[b][lo:hi].double().repeat_interleave(group, dim=1)
        v = values[b][lo:hi].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("nd,lnd->nl", q[r].double(), k) * 0.3
        ref = torch.einsum("nl,lnd->nd", torch.softmax(scores, -1), v)
        torch.testing.assert_close(out[r].double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[r].double(), torch.logsumexp(scores, -1),
                                   atol=1e-5, rtol=1e-5)


def test_prefill_rows_refuse_a_table_row_outside_the_table():
    k, v = torch.randn(4, BS, 2, 32), torch.randn(4, BS, 2, 32)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    lens = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="row_of must hold 3 rows of the 2-row block table"):
        paged_rows(torch.randn(3, 4, 32), k, v, 2, table, torch.zeros_like(lens), lens, 0.1,
                   row_of=torch.tensor([0, 1, 2]))
