"""Simulated attention ops (`_npu_reshape_and_cache`, `npu_fused_infer_attention_score`
TND + paged KV, `_npu_paged_attention`) against dense references written here.

Every reference works from each request's logical K/V ([kv_len, Hkv, D] tensors held by
the test), never from the paged cache, so a wrong block / slot lookup in the op shows up.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vllm_npu.ops.sim import (
    _npu_paged_attention,
    _npu_reshape_and_cache,
    npu_attention_update,
    npu_fused_infer_attention_score,
)
from vllm_npu.ops.sim.checks import NPUOpError
from tests.helpers.attention import (
    BS,
    FLOAT_DTYPES,
    HEADS,
    MASK,
    SCENARIOS,
    Paged,
    make_paged,
    make_queries,
    ref_attention,
    ref_sdpa,
)
from tests.helpers.attention import close as _close

def run_fia(q, paged: Paged, q_lens, kv_lens, n, hkv, scale, **kw):
    nb, _, _, d = paged.key_cache.shape
    ends = [sum(q_lens[:b + 1]) for b in range(len(q_lens))]
    args = dict(atten_mask=MASK, actual_seq_lengths=ends, actual_seq_lengths_kv=list(kv_lens),
                block_table=paged.block_table, num_heads=n, num_key_value_heads=hkv,
                scale=scale, input_layout="TND", sparse_mode=3, block_size=BS)
    args.update(kw)
    return npu_fused_infer_attention_score(q, paged.key_cache.view(nb, BS, hkv * d),
                                           paged.value_cache.view(nb, BS, hkv * d), **args)


# ------------------------------------------------------------------- reshape_and_cache


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("hkv,d", [(2, 16), (1, 32)])
def test_reshape_and_cache_writes_each_token_at_its_slot(dtype, hkv, d):
    g = torch.Generator().manual_seed(3)
    nb = 4
    key_cache = torch.zeros(nb, BS, hkv, d, dtype=dtype)
    value_cache = torch.zeros(nb, BS, hkv, d, dtype=dtype)
    slots = torch.tensor([0, 127, 128, 300, 511, 5, 260], dtype=torch.int32)
    key = torch.randn(len(slots), hkv, d, generator=g).to(dtype)
    value = torch.randn(len(slots), hkv, d, generator=g).to(dtype)
    _npu_reshape_and_cache(key, value, key_cache, value_cache, slots)
    written = torch.zeros(nb, BS, dtype=torch.bool)
    for t, s in enumerate(slots.tolist()):
        blk, off = s // BS, s % BS
        assert torch.equal(key_cache[blk, off], key[t])
        assert torch.equal(value_cache[blk, off], value[t])
        written[blk, off] = True
    # Everything else untouched.
    assert not key_cache[~written].any()
    assert not value_cache[~written].any()


def test_reshape_and_cache_overwrites_and_keeps_neighbours():
    hkv, d = 2, 16
    key_cache = torch.full((2, BS, hkv, d), 7.0)
    value_cache = torch.full((2, BS, hkv, d), -7.0)
    key = torch.arange(hkv * d, dtype=torch.float32).view(1, hkv, d)
    _npu_reshape_and_cache(key, -key, key_cache, value_cache,
                           torch.tensor([BS + 3], dtype=torch.int32))
    assert torch.equal(key_cache[1, 3], key[0]) and torch.equal(value_cache[1, 3], -key[0])
    assert (key_cache[1, 2] == 7).all() and (key_cache[1, 4] == 7).all()
    assert (key_cache[0, 3] == 7).all() and (value_cache[0] == -7).all()


def test_reshape_and_cache_empty_batch_is_noop():
    key_cache = torch.zeros(1, BS, 1, 16)
    value_cache = torch.zeros(1, BS, 1, 16)
    empty = torch.zeros(0, 1, 16)
    _npu_reshape_and_cache(empty, empty, key_cache, value_cache,
                           torch.zeros(0, dtype=torch.int32))
    assert not key_cache.any() and not value_cache.any()


@pytest.mark.parametrize("bad", [2 * BS, 10_000])
def test_reshape_and_cache_refuses_slot_out_of_range(bad):
    key_cache = torch.zeros(2, BS, 1, 16)
    key = torch.ones(2, 1, 16)
    slots = torch.tensor([0, bad], dtype=torch.int32)
    with pytest.raises(NPUOpError, match=rf"slot indices must be < {2 * BS}"):
        _npu_reshape_and_cache(key, key, key_cache, key_cache.clone(), slots)
    assert not key_cache.any()  # refused before any write


def test_reshape_and_cache_skips_padding_slots():
    """PAD_SLOT_ID (-1) marks the padding tokens of a graph batch: nothing is written."""
    key_cache = torch.zeros(2, BS, 1, 16)
    value_cache = torch.zeros(2, BS, 1, 16)
    key = torch.arange(3 * 16, dtype=torch.float32).view(3, 1, 16) + 1
    slots = torch.tensor([5, -1, BS + 2], dtype=torch.int32)
    _npu_reshape_and_cache(key, -key, key_cache, value_cache, slots)
    assert torch.equal(key_cache[0, 5], key[0]) and torch.equal(value_cache[1, 2], -key[2])
    assert int((key_cache != 0).any(-1).sum()) == 2  # the padding token went nowhere


def test_reshape_and_cache_refuses_int64_slots():
    key_cache = torch.zeros(2, BS, 1, 16)
    key = torch.ones(2, 1, 16)
    with pytest.raises(NPUOpError, match=r"slot_indices must be int32 of shape \(2,\)"):
        _npu_reshape_and_cache(key, key, key_cache, key_cache.clone(),
                               torch.tensor([0, 1], dtype=torch.int64))


def test_reshape_and_cache_refuses_wrong_slot_count():
    key_cache = torch.zeros(2, BS, 1, 16)
    key = torch.ones(3, 1, 16)
    with pytest.raises(NPUOpError, match=r"slot_indices must be int32 of shape \(3,\)"):
        _npu_reshape_and_cache(key, key, key_cache, key_cache.clone(),
                               torch.tensor([0, 1], dtype=torch.int32))


def test_reshape_and_cache_refuses_dtype_mismatch():
    key_cache = torch.zeros(2, BS, 1, 16, dtype=torch.float16)
    key = torch.ones(1, 1, 16)
    with pytest.raises(NPUOpError, match=r"must match the cache dtype torch\.float16"):
        _npu_reshape_and_cache(key, key, key_cache, key_cache.clone(),
                               torch.tensor([0], dtype=torch.int32))


def test_reshape_and_cache_refuses_head_shape_mismatch():
    key_cache = torch.zeros(2, BS, 2, 16)
    key = torch.ones(1, 1, 16)
    with pytest.raises(NPUOpError, match=r"key \(1, 1, 16\) does not fit cache"):
        _npu_reshape_and_cache(key, key, key_cache, key_cache.clone(),
                               torch.tensor([0], dtype=torch.int32))


def test_reshape_and_cache_refuses_non_contiguous_cache():
    # [nb, 2, BS, C] allocated block-major: the K plane [:, 0] is strided per block.
    kv = torch.zeros(3, 2, BS, 16)
    key_plane = kv[:, 0].view(3, BS, 1, 16)
    value_plane = kv[:, 1].view(3, BS, 1, 16)
    key = torch.ones(1, 1, 16)
    with pytest.raises(NPUOpError, match=r"key_cache must be contiguous"):
        _npu_reshape_and_cache(key, key, key_plane, value_plane,
                               torch.tensor([BS + 1], dtype=torch.int32))


# ------------------------------------------------------------- fused_infer_attention


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_fia_paged_matches_dense_causal_reference(scenario, heads, dtype):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv = HEADS[heads]
    d = 16
    scale = 1 / math.sqrt(d)
    paged = make_paged(kv_lens, hkv, d, dtype, seed=len(q_lens) + n)
    q = make_queries(q_lens, n, d, dtype)
    out, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, scale)
    assert out.shape == q.shape and out.dtype == dtype
    start = 0
    for b, ql in enumerate(q_lens):
        if ql:
            ref = ref_attention(q[start:start + ql], paged.k[b], paged.v[b], scale)
            _close(out[start:start + ql], ref, dtype)
        start += ql


@pytest.mark.parametrize("scenario", ["prefill", "chunked_prefix_hit", "mixed"])
def test_fia_matches_sdpa_with_boolean_mask(scenario):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv, d = 8, 2, 32
    paged = make_paged(kv_lens, hkv, d, torch.float32, seed=5)
    q = make_queries(q_lens, n, d, torch.float32, seed=6)
    out, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, 0.3)
    start = 0
    for b, ql in enumerate(q_lens):
        ref = ref_sdpa(q[start:start + ql], paged.k[b], paged.v[b], 0.3)
        torch.testing.assert_close(out[start:start + ql], ref, atol=1e-5, rtol=1e-5)
        start += ql


def test_fia_first_prefill_row_copies_first_value():
    # Row 0 of a pure prefill sees only kv position 0: output == v[0] exactly.
    n, hkv, d = 4, 2, 16
    paged = make_paged([9], hkv, d, torch.float32, seed=7)
    q = make_queries([9], n, d, torch.float32)
    out, _ = run_fia(q, paged, [9], [9], n, hkv, 1.0)
    torch.testing.assert_close(out[0], paged.v[0][0].repeat_interleave(2, dim=0))


def test_fia_decode_does_not_read_past_kv_length():
    # Poison the cache just past each request's kv length: the output must not change.
    n, hkv, d = 4, 2, 16
    kv_lens = [127, 128, 129]
    paged = make_paged(kv_lens, hkv, d, torch.float32, seed=8)
    q = make_queries([1, 1, 1], n, d, torch.float32)
    before, _ = run_fia(q, paged, [1, 1, 1], kv_lens, n, hkv, 0.25)
    for b, kl in enumerate(kv_lens):
        blk, off = divmod(paged.slot(b, kl), BS)
        paged.key_cache[blk, off] = 1e4
        paged.value_cache[blk, off] = 1e4
    after, _ = run_fia(q, paged, [1, 1, 1], kv_lens, n, hkv, 0.25)
    assert torch.equal(before, after)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("window", [1, 4, 100, 128])
@pytest.mark.parametrize("scenario", ["prefill", "mixed", "ragged_decode", "chunked_prefix_hit"])
def test_fia_sliding_window_band(scenario, window, dtype):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv, d = 8, 2, 16
    paged = make_paged(kv_lens, hkv, d, dtype, seed=9)
    q = make_queries(q_lens, n, d, dtype, seed=10)
    out, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, 0.25, sparse_mode=4,
                     pre_tokens=window - 1, next_tokens=0)
    start = 0
    for b, ql in enumerate(q_lens):
        ref = ref_attention(q[start:start + ql], paged.k[b], paged.v[b], 0.25, window=window)
        _close(out[start:start + ql], ref, dtype)
        start += ql


def test_fia_window_one_is_value_of_own_position():
    n, hkv, d = 2, 1, 16
    kv_lens = [40, 200]
    q_lens = [40, 3]
    paged = make_paged(kv_lens, hkv, d, torch.float32, seed=11)
    q = make_queries(q_lens, n, d, torch.float32)
    out, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, 1.0, sparse_mode=4,
                     pre_tokens=0, next_tokens=0)
    torch.testing.assert_close(out[:40], paged.v[0].expand(40, n, d))
    torch.testing.assert_close(out[40:], paged.v[1][197:200].expand(3, n, d))


def test_fia_wide_window_equals_causal():
    q_lens, kv_lens = SCENARIOS["mixed"]
    n, hkv, d = 4, 2, 16
    paged = make_paged(kv_lens, hkv, d, torch.float32, seed=12)
    q = make_queries(q_lens, n, d, torch.float32)
    causal, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, 0.5)
    band, _ = run_fia(q, paged, q_lens, kv_lens, n, hkv, 0.5, sparse_mode=4,
                      pre_tokens=max(kv_lens), next_tokens=0)
    torch.testing.assert_close(band, causal, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("scenario", ["mixed", "ragged_prefill", "single_token"])
@pytest.mark.parametrize("window", [None, 50])
def test_fia_softmax_lse(scenario, dtype, window):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv, d = 8, 2, 16
    paged = make_paged(kv_lens, hkv, d, dtype, seed=13)
    q = make_queries(q_lens, n, d, dtype, seed=14)
    kw = {} if window is None else dict(sparse_mode=4, pre_tokens=window - 1, next_tokens=0)
    out, lse = run_fia(q, paged, q_lens, kv_lens, n, hkv, 0.125, softmax_lse_flag=True, **kw)
    assert lse.shape == (sum(q_lens), n, 1) and lse.dtype == torch.float32
    start = 0
    for b, ql in enumerate(q_lens):
        ref_out, ref_lse = ref_attention(q[start:start + ql], paged.k[b], paged.v[b], 0.125,
                                         window=window, want_lse=True)
        torch.testing.assert_close(lse[start:start + ql, :, 0], ref_lse, atol=1e-4, rtol=1e-5)
        _close(out[start:start + ql], ref_out, dtype)
        start += ql


def test_fia_unpaged_tnd_with_cumulative_kv():
    # Without block_table, key/value are [T_kv, Hkv, D] with cumulative kv ends; the dense
    # TND form takes D 128 (or 192).
    n, hkv, d = 4, 2, 128
    q_lens, kv_lens = [2, 3], [5, 3]
    g = torch.Generator().manual_seed(15)
    k = [torch.randn(n_, hkv, d, generator=g) for n_ in kv_lens]
    v = [torch.randn(n_, hkv, d, generator=g) for n_ in kv_lens]
    q = make_queries(q_lens, n, d, torch.float32)
    out, _ = npu_fused_infer_attention_score(
        q, torch.cat(k), torch.cat(v), atten_mask=MASK, actual_seq_lengths=[2, 5],
        actual_seq_lengths_kv=[5, 8], num_heads=n, num_key_value_heads=hkv, scale=0.5,
        input_layout="TND", sparse_mode=3)
    torch.testing.assert_close(out[:2], ref_attention(q[:2], k[0], v[0], 0.5))
    torch.testing.assert_close(out[2:], ref_attention(q[2:], k[1], v[1], 0.5))


@pytest.mark.parametrize("dims,heads,dtype,match", [
    ((64, 64), (4, 4), torch.bfloat16, r"dense TND takes .* got \(64, 64, 64\)"),
    ((96, 32), (4, 4), torch.bfloat16, "got \\(96, 96, 32\\)"),
    ((192, 192), (4, 2), torch.bfloat16, "192 without grouped heads"),
    ((128, 128), (4, 4), torch.float16, "dense TND takes bfloat16, got torch.float16"),
])
def test_fia_dense_tnd_takes_its_documented_forms_only(dims, heads, dtype, match):
    """No block table, no rope: head dims (128, 128, 128) or (192, 192, 128 / 192 without
    grouped heads), bfloat16 (op-plugin's TND constraints; the kernel's TND check)."""
    (dqk, dv), (n, hkv) = dims, heads
    q, k, v = torch.ones(3, n, dqk, dtype=dtype), torch.ones(3, hkv, dqk, dtype=dtype), \
        torch.ones(3, hkv, dv, dtype=dtype)
    with pytest.raises(NPUOpError, match=match):
        npu_fused_infer_attention_score(q, k, v, atten_mask=MASK, actual_seq_lengths=[3],
                                        actual_seq_lengths_kv=[3], num_heads=n,
                                        num_key_value_heads=hkv, scale=0.5,
                                        input_layout="TND", sparse_mode=3)
    for ok in ((128, 128, torch.bfloat16), (192, 128, torch.bfloat16)):
        q, k, v = (torch.ones(3, h, d_, dtype=ok[2]) for h, d_ in
                   ((n, ok[0]), (hkv, ok[0]), (hkv, ok[1])))
        npu_fused_infer_attention_score(q, k, v, atten_mask=MASK, actual_seq_lengths=[3],
                                        actual_seq_lengths_kv=[3], num_heads=n,
                                        num_key_value_heads=hkv, scale=0.5,
                                        input_layout="TND", sparse_mode=3)


# ------------------------------------------------------------------ FIA refusals


def _fia_setup(dtype=torch.float32, n=4, hkv=2, d=16):
    paged = make_paged([130, 5], hkv, d, dtype, seed=16)
    q = make_queries([3, 1], n, d, dtype)
    return paged, q


def test_fia_refuses_block_size_16():
    hkv, d = 2, 16
    key = torch.zeros(40, 16, hkv * d)
    q = torch.zeros(1, 4, d)
    with pytest.raises(NPUOpError, match=r"page attention needs block_size in 128\.\.512, a "
                                         r"multiple of 128.*block_size=16"):
        npu_fused_infer_attention_score(
            q, key, key.clone(), atten_mask=MASK, actual_seq_lengths=[1],
            actual_seq_lengths_kv=[3], block_table=torch.zeros(1, 4, dtype=torch.int32),
            num_heads=4, num_key_value_heads=hkv, scale=1.0, input_layout="TND",
            sparse_mode=3, block_size=16)


@pytest.mark.parametrize("block_size", [256, 640, 0])
def test_fia_refuses_block_size_not_matching_cache(block_size):
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=rf"block_size={block_size}, key \(\d+, 128, 32\)"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, block_size=block_size)


def test_fia_refuses_int8_query():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"query has dtype torch\.int8"):
        run_fia(q.to(torch.int8), paged, [3, 1], [130, 5], 4, 2, 1.0)


def test_fia_refuses_mixed_dtypes():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"query/key/value dtypes differ"):
        run_fia(q.to(torch.float16), paged, [3, 1], [130, 5], 4, 2, 1.0)


@pytest.mark.parametrize("which", ["actual_seq_lengths", "actual_seq_lengths_kv"])
def test_fia_refuses_tensor_seq_lengths(which):
    paged, q = _fia_setup()
    values = {"actual_seq_lengths": [3, 4], "actual_seq_lengths_kv": [130, 5]}
    values[which] = torch.tensor(values[which], dtype=torch.int32)
    with pytest.raises(NPUOpError, match=rf"{which} must be a host list of ints, got Tensor"):
        npu_fused_infer_attention_score(
            q, paged.key_cache.view(paged.num_blocks, BS, 32),
            paged.value_cache.view(paged.num_blocks, BS, 32), atten_mask=MASK,
            block_table=paged.block_table, num_heads=4, num_key_value_heads=2, scale=1.0,
            input_layout="TND", sparse_mode=3, block_size=BS, **values)


@pytest.mark.parametrize("n,hkv,msg", [
    (6, 4, r"num_heads=6 must be a positive multiple of num_key_value_heads=4"),
    (4, 3, r"num_heads=4 must be a positive multiple of num_key_value_heads=3"),
    (130, 2, r"num_heads/num_key_value_heads=65 exceeds the device limit of 64"),
])
def test_fia_refuses_bad_head_ratio(n, hkv, msg):
    d = 16
    paged = make_paged([4], 2, d, torch.float32)
    q = torch.zeros(4, n, d)
    with pytest.raises(NPUOpError, match=msg):
        npu_fused_infer_attention_score(
            q, paged.key_cache.view(paged.num_blocks, BS, 2 * d),
            paged.value_cache.view(paged.num_blocks, BS, 2 * d), atten_mask=MASK,
            actual_seq_lengths=[4], actual_seq_lengths_kv=[4], block_table=paged.block_table,
            num_heads=n, num_key_value_heads=hkv, scale=1.0, input_layout="TND",
            sparse_mode=3, block_size=BS)


def test_fia_refuses_query_heads_not_num_heads():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"num_heads=8 but query has 4 heads"):
        run_fia(q, paged, [3, 1], [130, 5], 8, 2, 1.0)


@pytest.mark.parametrize("mask", [None, torch.ones(1024, 1024, dtype=torch.bool).triu(1)])
@pytest.mark.parametrize("mode", [3, 4])
def test_fia_refuses_missing_or_small_mask(mask, mode):
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=rf"sparse_mode={mode} needs the compressed "
                                         r"\(2048, 2048\) atten_mask"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, sparse_mode=mode, atten_mask=mask)


def test_fia_refuses_float_mask():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"atten_mask dtype torch\.float32"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=MASK.float())


def test_fia_refuses_unknown_sparse_mode():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"sparse_mode=7"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, sparse_mode=7)


def test_fia_refuses_non_contiguous_query():
    paged, q = _fia_setup()
    q_nc = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strided [T, N, D]
    assert not q_nc.is_contiguous()
    with pytest.raises(NPUOpError, match=r"query must be contiguous"):
        run_fia(q_nc, paged, [3, 1], [130, 5], 4, 2, 1.0)


@pytest.mark.parametrize("ends,match", [
    ([3, 2], r"must be non-decreasing cumulative ends, got \[3, 2\]"),
    # TND: the last end must be T exactly (CANN: "queryT != last element of
    # actualSequenceLengthQ"), neither past it nor short of it
    ([2, 5], r"last actual_seq_lengths entry must equal the query's T=4; got \[2, 5\]"),
    ([1, 3], r"last actual_seq_lengths entry must equal the query's T=4; got \[1, 3\]")])
def test_fia_refuses_bad_cumulative_ends(ends, match):
    paged, q = _fia_setup()  # T = 4
    with pytest.raises(NPUOpError, match=match):
        npu_fused_infer_attention_score(
            q, paged.key_cache.view(paged.num_blocks, BS, 32),
            paged.value_cache.view(paged.num_blocks, BS, 32), atten_mask=MASK,
            actual_seq_lengths=ends, actual_seq_lengths_kv=[130, 5],
            block_table=paged.block_table, num_heads=4, num_key_value_heads=2, scale=1.0,
            input_layout="TND", sparse_mode=3, block_size=BS)


def test_fia_refuses_kv_length_count_mismatch():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"3 kv lengths for 2 batches"):
        run_fia(q, paged, [3, 1], [130, 5, 1], 4, 2, 1.0)


def test_fia_refuses_int64_block_table():
    paged, q = _fia_setup()
    paged.block_table = paged.block_table.long()
    with pytest.raises(NPUOpError, match=r"block_table must be int32 \[B=2, max_blocks\], "
                                         r"got torch\.int64"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0)


def test_fia_refuses_kv_longer_than_block_table():
    paged, q = _fia_setup()  # max_blocks = 3
    with pytest.raises(NPUOpError, match=r"kv length 385 exceeds the block table's 3 blocks"):
        run_fia(q, paged, [3, 1], [385, 5], 4, 2, 1.0)


def test_fia_refuses_query_longer_than_kv_when_causal():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"right-down causal needs q_len <= kv_len"):
        run_fia(q, paged, [3, 1], [2, 5], 4, 2, 1.0)


def test_fia_refuses_unaligned_head_dim_for_half():
    paged = make_paged([4], 1, 24, torch.float16)
    q = torch.zeros(4, 2, 24, dtype=torch.float16)
    with pytest.raises(NPUOpError, match=r"head dim 24 must be 16-aligned for torch\.float16"):
        run_fia(q, paged, [4], [4], 2, 1, 1.0)


def test_fia_refuses_negative_kv_length():
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"actual_seq_lengths_kv has negative entries"):
        run_fia(q, paged, [3, 1], [130, -5], 4, 2, 1.0)


def test_fia_refuses_layout_other_than_tnd():
    paged, q = _fia_setup()
    with pytest.raises(NotImplementedError, match=r"input_layout='TND' only, got 'BSH'"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, input_layout="BSH")


# --------------------------------------------------------------------- paged attention


def run_paged_attention(q, paged: Paged, kv_lens, n, hkv, scale, **kw):
    out = torch.full_like(q, float("nan"))
    args = dict(num_kv_heads=hkv, num_heads=n, scale_value=scale,
                block_table=paged.block_table,
                context_lens=torch.tensor(kv_lens, dtype=torch.int32), out=out)
    args.update(kw)
    _npu_paged_attention(q, paged.key_cache, paged.value_cache, **args)
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("kv_lens", [[1], [127, 128, 129, 257], [300, 2]])
def test_paged_attention_matches_reference_decode(kv_lens, heads, dtype):
    n, hkv = HEADS[heads]
    d = 32
    paged = make_paged(kv_lens, hkv, d, dtype, seed=17)
    q = make_queries([1] * len(kv_lens), n, d, dtype, seed=18)
    out = run_paged_attention(q, paged, kv_lens, n, hkv, 1 / math.sqrt(d))
    assert out.dtype == dtype
    for b in range(len(kv_lens)):
        # A decode query sees all kv positions.
        ref = ref_attention(q[b:b + 1], paged.k[b], paged.v[b], 1 / math.sqrt(d))
        _close(out[b:b + 1], ref, dtype)


def test_paged_attention_agrees_with_fia_decode():
    n, hkv, d = 8, 2, 16
    kv_lens = [127, 128, 129, 257]
    paged = make_paged(kv_lens, hkv, d, torch.float32, seed=19)
    q = make_queries([1] * 4, n, d, torch.float32)
    pa = run_paged_attention(q, paged, kv_lens, n, hkv, 0.2)
    fia, _ = run_fia(q, paged, [1] * 4, kv_lens, n, hkv, 0.2)
    torch.testing.assert_close(pa, fia, atol=1e-6, rtol=1e-6)


def test_paged_attention_refuses_int64_context_lens():
    paged = make_paged([5, 6], 2, 16, torch.float32)
    q = make_queries([1, 1], 4, 16, torch.float32)
    with pytest.raises(NPUOpError, match=r"context_lens must be a host int32 tensor of "
                                         r"shape \(2,\)"):
        run_paged_attention(q, paged, [5, 6], 4, 2, 1.0,
                            context_lens=torch.tensor([5, 6], dtype=torch.int64))


def test_paged_attention_refuses_int64_block_table():
    paged = make_paged([5, 6], 2, 16, torch.float32)
    q = make_queries([1, 1], 4, 16, torch.float32)
    with pytest.raises(NPUOpError, match=r"block_table must be int32 with 2 rows, got "
                                         r"torch\.int64"):
        run_paged_attention(q, paged, [5, 6], 4, 2, 1.0,
                            block_table=paged.block_table.long())


def test_paged_attention_refuses_int8_query():
    paged = make_paged([5], 2, 16, torch.float32)
    q = torch.zeros(1, 4, 16, dtype=torch.int8)
    with pytest.raises(NPUOpError, match=r"_npu_paged_attention: query has dtype torch\.int8"):
        _npu_paged_attention(q, paged.key_cache, paged.value_cache, 2, 4, 1.0,
                             paged.block_table, torch.tensor([5], dtype=torch.int32),
                             torch.zeros(1, 4, 16))


def test_paged_attention_refuses_head_mismatch():
    paged = make_paged([5], 2, 16, torch.float32)
    q = make_queries([1], 6, 16, torch.float32)
    with pytest.raises(NPUOpError, match=r"num_heads=6 must be a positive multiple of "
                                         r"num_key_value_heads=4"):
        run_paged_attention(q, paged, [5], 6, 4, 1.0)


def test_paged_attention_refuses_out_mismatch():
    paged = make_paged([5], 2, 16, torch.float32)
    q = make_queries([1], 4, 16, torch.float32)
    with pytest.raises(NPUOpError, match=r"out must match query"):
        run_paged_attention(q, paged, [5], 4, 2, 1.0, out=torch.zeros(1, 4, 16,
                                                                     dtype=torch.float16))


def test_paged_attention_refuses_context_past_block_table():
    paged = make_paged([5], 2, 16, torch.float32)  # 2 table entries
    q = make_queries([1], 4, 16, torch.float32)
    with pytest.raises(NPUOpError, match=r"context length 300 exceeds the block table"):
        run_paged_attention(q, paged, [300], 4, 2, 1.0)


# ------------------------------------------------------------------ npu_attention_update


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sp", [1, 2, 5])
def test_attention_update_matches_lse_weighting(dtype, sp):
    g = torch.Generator().manual_seed(sp)
    n, d = 12, 32
    lse = [torch.randn(n, generator=g) * 3 for _ in range(sp)]
    out = [torch.randn(n, d, generator=g).to(dtype) for _ in range(sp)]
    merged, lse_m = npu_attention_update(lse, out, 1)
    ref_lse = torch.logsumexp(torch.stack(lse), 0)
    ref = sum(o.float() * torch.exp(s - ref_lse)[:, None] for o, s in zip(out, lse))
    assert merged.dtype == dtype
    torch.testing.assert_close(merged.float(), ref, atol=1e-2 if dtype != torch.float32
                               else 1e-6, rtol=1e-2 if dtype != torch.float32 else 1e-6)
    torch.testing.assert_close(lse_m, ref_lse)
    assert npu_attention_update(lse, out, 0)[1] is None


@pytest.mark.parametrize("case,match", [
    ("inf", "non-finite"), ("shape", "expected"), ("type", "update_type=2"),
    ("count", "one lse and one local_out"), ("dim", "multiple of 8")])
def test_attention_update_rejects(case, match):
    lse = [torch.zeros(4), torch.zeros(4)]
    out = [torch.zeros(4, 16), torch.zeros(4, 16)]
    update_type = 0
    if case == "inf":
        lse[1][2] = float("-inf")
    elif case == "shape":
        out[1] = torch.zeros(4, 8)
    elif case == "type":
        update_type = 2
    elif case == "count":
        lse = lse[:1]
    elif case == "dim":
        out = [torch.zeros(4, 12), torch.zeros(4, 12)]
    with pytest.raises(NPUOpError, match=match):
        npu_attention_update(lse, out, update_type)


# ------------------------------------------ documented limits (#12 item 6)


@pytest.mark.parametrize("mask", [MASK.tril(-1), ~MASK, torch.zeros_like(MASK),
                                  MASK.clone().index_fill_(0, torch.tensor([5]), False)])
def test_fia_refuses_a_mask_that_is_not_the_compressed_causal_one(mask):
    """Only the contents matter here: right shape and dtype, wrong matrix."""
    paged, q = _fia_setup()
    with pytest.raises(NPUOpError, match=r"sparse_mode=3 needs the compressed causal mask "
                                         r"\(True strictly above the diagonal"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=mask)
    run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=MASK.to(torch.uint8))


def _paged_with_block(block_size, head_size, num_blocks=4):
    cache = torch.zeros(num_blocks, block_size, 1, head_size)
    q = torch.zeros(1, 1, head_size)
    table = torch.zeros(1, 2, dtype=torch.int32)
    return q, cache, table


@pytest.mark.parametrize("block_size,head_size,match", [
    (24, 64, r"block_size 24 must be a multiple of 16"),
    (256, 288, r"head size 288 with block_size 256: needs head size in \(0, 576\] and "
               r"block_size <= 128 above 256"),
    (128, 592, r"head size 592 with block_size 128"),
])
def test_paged_attention_refuses_atb_block_and_head_limits(block_size, head_size, match):
    q, cache, table = _paged_with_block(block_size, head_size)
    with pytest.raises(NPUOpError, match=match):
        _npu_paged_attention(q, cache, cache.clone(), 1, 1, 1.0, table,
                             torch.tensor([3], dtype=torch.int32), torch.zeros_like(q))


def test_paged_attention_takes_wide_heads_with_blocks_of_128():
    q, cache, table = _paged_with_block(128, 288)
    out = torch.full_like(q, float("nan"))
    _npu_paged_attention(q, cache, cache.clone(), 1, 1, 1.0, table,
                         torch.tensor([3], dtype=torch.int32), out)
    assert torch.equal(out, torch.zeros_like(q))  # zero values everywhere


@pytest.mark.parametrize("bad", [-1, 4])
def test_paged_attention_refuses_block_table_entries_outside_the_cache(bad):
    """ATB: every blockTables element in [0, num_blocks), used or not."""
    q, cache, table = _paged_with_block(128, 64)
    table[0, 1] = bad  # past the context: never read, still refused
    with pytest.raises(NPUOpError, match=r"block_table elements must lie in \[0, 4\)"):
        _npu_paged_attention(q, cache, cache.clone(), 1, 1, 1.0, table,
                             torch.tensor([3], dtype=torch.int32), torch.zeros_like(q))


def test_fia_checks_an_inference_mode_mask():
    """Masks built under torch.inference_mode (as in the engine) have no version counter."""
    paged, q = _fia_setup()
    with torch.inference_mode():
        mask = torch.ones(2048, 2048, dtype=torch.bool).triu_(1)
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=mask)
        bad = torch.zeros(2048, 2048, dtype=torch.bool)
        with pytest.raises(NPUOpError, match="compressed causal mask"):
            run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=bad)


def test_fia_rechecks_a_new_mask_at_a_checked_masks_address():
    """A check is remembered per mask storage, not per address: a new mask whose memory is
    where a checked one was (the allocator reuses freed blocks) is checked again (a CI run
    once passed a wrong mask this way)."""
    paged, q = _fia_setup()
    memory = np.triu(np.ones((2048, 2048), dtype=np.bool_), 1)
    run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=torch.from_numpy(memory))
    memory[:] = False
    bad = torch.from_numpy(memory)  # same address, new storage, version 0 again
    with pytest.raises(NPUOpError, match="compressed causal mask"):
        run_fia(q, paged, [3, 1], [130, 5], 4, 2, 1.0, atten_mask=bad)
