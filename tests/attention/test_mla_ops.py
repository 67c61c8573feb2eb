"""Simulated MLA ops vs reference math, and the refusals the ATB ops make."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import (
    _npu_paged_attention_mla,
    _npu_reshape_and_cache_siso,
    npu_multi_head_latent_attention,
)
from vllm_npu.ops.sim.checks import NPUOpError

BS = 128
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=3e-3, rtol=3e-3)}


def _latent_setup(B, N, L, R, lens, dtype, num_blocks=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(num_blocks, BS, 1, L + R, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    max_blocks = max(-(-n // BS) for n in lens)
    block_table = torch.zeros(B, max_blocks + 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        nb = -(-n // BS)
        block_table[b, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    query = torch.randn(B, N, L + R, generator=g).to(dtype)
    return query, cache, block_table, torch.tensor(lens, dtype=torch.int32)


def _reference(query, cache, block_table, lens, L, scale):
    outs = []
    for b, n in enumerate(lens.tolist()):
        rows = torch.cat([cache[int(block_table[b, p // BS]), p % BS] for p in range(n)])
        scores = (query[b].float() @ rows.float().T) * scale           # [N, n]
        outs.append(torch.softmax(scores, -1) @ rows[:, :L].float())    # [N, L]
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims", [(512, 64, 8), (32, 16, 4)])
def test_paged_attention_mla_matches_reference(dims, dtype):
    L, R, N = dims
    lens = [1, 127, 128, 129, 300]  # ragged, on and across block boundaries
    query, cache, bt, cl = _latent_setup(len(lens), N, L, R, lens, dtype)
    out = torch.full((len(lens), N, L), 7.0, dtype=dtype)
    _npu_paged_attention_mla(query, cache, 1, N, 0.07, bt, cl, L, out)
    torch.testing.assert_close(out.float(), _reference(query, cache, bt, cl, L, 0.07),
                               **TOL[dtype])


def test_paged_attention_mla_refusals():
    L, R, N = 32, 16, 4
    query, cache, bt, cl = _latent_setup(2, N, L, R, [5, 9], torch.float16)
    out = torch.empty(2, N, L, dtype=torch.float16)

    def call(**kw):
        args = dict(query=query, key_cache=cache, num_kv_heads=1, num_heads=N,
                    scale_value=0.1, block_table=bt, context_lens=cl, mla_vheadsize=L,
                    out=out) | kw
        _npu_paged_attention_mla(**args)

    call()
    cases = [
        (dict(num_kv_heads=2), "MQA only"),
        (dict(num_heads=8), "do not match"),
        (dict(mla_vheadsize=L + R + 1), "mla_vheadsize"),
        (dict(query=query.to(torch.int8)), "dtype"),
        (dict(query=query.float()), "dtypes differ"),
        (dict(block_table=bt.long()), "block_table"),
        (dict(context_lens=cl.long()), "context_lens"),
        (dict(context_lens=torch.tensor([0, 9], dtype=torch.int32)), "context lengths"),
        (dict(context_lens=torch.tensor([5, 9999], dtype=torch.int32)), "context lengths"),
        (dict(out=torch.empty(2, N, L + R, dtype=torch.float16)), "out must be"),
        (dict(query=query.transpose(0, 1).contiguous().transpose(0, 1)), "contiguous"),
        (dict(key_cache=cache.squeeze(2)), "4-D"),
    ]
    for kw, match in cases:
        with pytest.raises(NPUOpError, match=match):
            call(**kw)
    # A head wider than 576, and a >256-wide head with 256-token blocks.
    wide_q = torch.zeros(1, N, 640, dtype=torch.float16)
    with pytest.raises(NPUOpError, match="head size 640"):
        _npu_paged_attention_mla(wide_q, torch.zeros(2, BS, 1, 640, dtype=torch.float16), 1,
                                 N, 0.1, bt[:1], cl[:1], 512, torch.empty(1, N, 512,
                                                                          dtype=torch.float16))
    q576 = torch.zeros(1, N, 576, dtype=torch.float16)
    with pytest.raises(NPUOpError, match="block_size <= 128"):
        _npu_paged_attention_mla(q576, torch.zeros(2, 256, 1, 576, dtype=torch.float16), 1,
                                 N, 0.1, bt[:1], cl[:1], 512,
                                 torch.empty(1, N, 512, dtype=torch.float16))
    # Narrow heads may use larger blocks.
    _npu_paged_attention_mla(query[:1], torch.zeros(2, 256, 1, L + R, dtype=torch.float16),
                             1, N, 0.1, bt[:1], cl[:1], L, out[:1].clone())


def test_reshape_and_cache_siso_writes_rows():
    cache = torch.zeros(4, BS, 1, 48)
    rows = torch.randn(5, 1, 48)
    slots = torch.tensor([0, 127, 128, 300, 511], dtype=torch.int32)
    _npu_reshape_and_cache_siso(rows, cache, slots)
    for i, s in enumerate(slots.tolist()):
        assert torch.equal(cache[s // BS, s % BS], rows[i])
    assert int((cache != 0).any(-1).sum()) == 5


def test_reshape_and_cache_siso_refusals():
    cache = torch.zeros(4, BS, 1, 48)
    rows = torch.randn(2, 1, 48)
    ok = torch.tensor([1, 2], dtype=torch.int32)
    cases = [
        ((rows, cache, torch.tensor([1, -1], dtype=torch.int32)), "slot indices"),
        ((rows, cache, torch.tensor([1, 512], dtype=torch.int32)), "slot indices"),
        ((rows, cache, ok.long()), "int32"),
        ((rows, cache, ok[:1]), "shape"),
        ((rows.half(), cache, ok), "dtype"),
        ((rows[..., :32], cache, ok), "does not fit"),
        ((rows.squeeze(1), cache, ok), "3-D"),
        ((rows.int(), cache.int(), ok), "dtype"),
        ((rows, cache.transpose(0, 1), ok), "contiguous"),
    ]
    for args, match in cases:
        with pytest.raises(NPUOpError, match=match):
            _npu_reshape_and_cache_siso(*args)


def _split_call(query, cache, bt, lens, L, scale, **kw):
    """npu_multi_head_latent_attention on views of the one latent cache, as the backend
    calls it under decode context parallelism."""
    B, N, _ = query.shape
    out = torch.full((B, N, L), 7.0, dtype=query.dtype)
    lse = torch.empty(B, N, 1, dtype=query.dtype)
    ret = npu_multi_head_latent_attention(
        query[..., :L].contiguous(), query[..., L:].contiguous(), cache[..., :L],
        cache[..., L:], bt, lens, N, scale, 1, output=out, lse=lse, **kw)
    return ret, out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [(512, 64, 8), (32, 16, 4)])
def test_latent_attention_with_lse_matches_reference(dims, dtype):
    L, R, N = dims
    lens = [1, 127, 129, 300]
    query, cache, bt, cl = _latent_setup(len(lens), N, L, R, lens, dtype, seed=3)
    (ret_out, ret_lse), out, lse = _split_call(query, cache, bt, lens, L, 0.07,
                                               calc_type="calc_type_ring", return_lse=True)
    assert ret_out is out and ret_lse is lse
    torch.testing.assert_close(out.float(), _reference(query, cache, bt, cl, L, 0.07),
                               **TOL[dtype])
    ref_lse = torch.stack([torch.logsumexp(
        (query[b].float() @ torch.cat([cache[int(bt[b, p // BS]), p % BS]
                                       for p in range(n)]).float().T) * 0.07, -1)
        for b, n in enumerate(lens)])
    assert lse.dtype == dtype
    torch.testing.assert_close(lse[..., 0].float(), ref_lse, **TOL[dtype])


def test_latent_attention_empty_shard_gives_zero_and_minus_inf():
    """A context-parallel rank holding none of a request: output 0, lse -inf."""
    query, cache, bt, _ = _latent_setup(2, 4, 32, 16, [5, 9], torch.float32)
    (_, _), out, lse = _split_call(query, cache, bt, [5, 0], 32, 0.1,
                                   calc_type="calc_type_ring", return_lse=True)
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()
    assert torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("kw,match", [
    (dict(return_lse=True), "calc_type_ring"),
    (dict(calc_type="ring"), "calc_type='ring'"),
    (dict(calc_type="calc_type_ring", mask_type="mask_type_spec"), "does not implement"),
])
def test_latent_attention_refusals(kw, match):
    query, cache, bt, _ = _latent_setup(2, 4, 32, 16, [5, 9], torch.float32)
    with pytest.raises((NPUOpError, NotImplementedError), match=match):
        _split_call(query, cache, bt, [5, 9], 32, 0.1, **kw)
    with pytest.raises(NPUOpError, match="context_lens must be 2 host ints"):
        _split_call(query, cache, bt, [5, 9, 1], 32, 0.1)
