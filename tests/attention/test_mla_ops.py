"""Simulated MLA ops vs reference math, and the refusals the ATB ops make."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import npu_multi_head_latent_attention
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


def _planes(cache, L):
    """The two dense planes the MLA backend keeps (latent_planes)."""
    return cache[..., :L].contiguous(), cache[..., L:].contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims", [(512, 64, 8), (512, 64, 16)])
def test_latent_attention_without_lse_matches_reference(dims, dtype):
    """The plain decode call (no lse): ragged lengths on and across block boundaries."""
    L, R, N = dims
    lens = [1, 127, 128, 129, 300]
    query, cache, bt, cl = _latent_setup(len(lens), N, L, R, lens, dtype)
    nope, rope = _planes(cache, L)
    out = torch.full((len(lens), N, L), 7.0, dtype=dtype)
    ret = npu_multi_head_latent_attention(query[..., :L].contiguous(),
                                          query[..., L:].contiguous(), nope, rope, bt, lens,
                                          N, 0.07, 1, output=out)
    assert ret is out
    torch.testing.assert_close(out.float(), _reference(query, cache, bt, cl, L, 0.07),
                               **TOL[dtype])


def test_latent_attention_refuses_strided_views_of_one_cache():
    """ATB takes dense ND tensors: the nope/rope halves of a merged [.., L+R] cache are
    strided views, which torch_npu would copy whole on every call."""
    L, R, N = 512, 64, 8
    query, cache, bt, _ = _latent_setup(2, N, L, R, [5, 9], torch.float16)
    q_nope, q_rope = query[..., :L].contiguous(), query[..., L:].contiguous()
    with pytest.raises(NPUOpError, match="ctkv must be contiguous"):
        npu_multi_head_latent_attention(q_nope, q_rope, cache[..., :L], cache[..., L:], bt,
                                        [5, 9], N, 0.1, 1)
    nope, rope = _planes(cache, L)
    npu_multi_head_latent_attention(q_nope, q_rope, nope, rope, bt, [5, 9], N, 0.1, 1)


def test_latent_attention_shape_limits():
    L, R, N = 512, 64, 8
    query, cache, bt, _ = _latent_setup(2, N, L, R, [5, 9], torch.float16)
    q_nope, q_rope = query[..., :L].contiguous(), query[..., L:].contiguous()
    nope, rope = _planes(cache, L)
    cases = [
        (dict(kv_headnum=2), "MQA only"),
        (dict(q_headnum=16), "MQA only"),
        (dict(q_nope=q_nope.float()), "q_rope dtype torch.float16 != q_nope dtype torch.float32"),
        (dict(block_tables=bt.long()), "block_tables must be int32"),
        (dict(context_lens=[5, 9999]), "context_lens must be 2 host ints"),
        (dict(output=torch.empty(2, N, L + R, dtype=torch.float16)), "output must be"),
        # ATB multi_latent_attention_operation.cpp: "decoder blockSize should be 128",
        # head size 512 / rope 64, headNum {8, 16, 32, 64, 128} (ops/sim/fia_shapes.py)
        (dict(ctkv=torch.zeros(2, 64, 1, L, dtype=torch.float16),
              k_rope=torch.zeros(2, 64, 1, R, dtype=torch.float16)), "block_size 128, got 64"),
        (dict(q_nope=torch.zeros(2, N, 448, dtype=torch.float16),
              ctkv=torch.zeros(16, BS, 1, 448, dtype=torch.float16)), "latent of 512"),
        (dict(q_nope=q_nope[:, :4].contiguous(), q_rope=q_rope[:, :4].contiguous(),
              q_headnum=4, output=None), "headNum 4"),
    ]
    for kw, match in cases:
        args = dict(q_nope=q_nope, q_rope=q_rope, ctkv=nope, k_rope=rope, block_tables=bt,
                    context_lens=[5, 9], q_headnum=N, qk_scale=0.1, kv_headnum=1) | kw
        with pytest.raises(NPUOpError, match=match):
            npu_multi_head_latent_attention(**args)


def _split_call(query, cache, bt, lens, L, scale, **kw):
    """npu_multi_head_latent_attention with an lse, as the backend calls it under decode
    context parallelism."""
    B, N, _ = query.shape
    out = torch.full((B, N, L), 7.0, dtype=query.dtype)
    lse = torch.empty(B, N, 1, dtype=query.dtype)
    nope, rope = _planes(cache, L)
    ret = npu_multi_head_latent_attention(
        query[..., :L].contiguous(), query[..., L:].contiguous(), nope, rope, bt, lens, N,
        scale, 1, output=out, lse=lse, **kw)
    return ret, out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [(512, 64, 8), (512, 64, 16)])
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
    query, cache, bt, _ = _latent_setup(2, 8, 512, 64, [5, 9], torch.float32)
    (_, _), out, lse = _split_call(query, cache, bt, [5, 0], 512, 0.1,
                                   calc_type="calc_type_ring", return_lse=True)
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()
    assert torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("kw,match", [
    (dict(return_lse=True), "calc_type_ring"),
    (dict(calc_type="ring"), "calc_type='ring'"),
    (dict(calc_type="calc_type_ring", mask_type="mask_type_spec"), "does not implement"),
])
def test_latent_attention_refusals(kw, match):
    query, cache, bt, _ = _latent_setup(2, 8, 512, 64, [5, 9], torch.float32)
    with pytest.raises((NPUOpError, NotImplementedError), match=match):
        _split_call(query, cache, bt, [5, 9], 512, 0.1, **kw)
    with pytest.raises(NPUOpError, match="context_lens must be 2 host ints"):
        _split_call(query, cache, bt, [5, 9, 1], 512, 0.1)


def _causal_mask():
    return torch.ones(2048, 2048, dtype=torch.bool).triu_(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_attention_mla_form_verifies_drafts_causally(dtype):
    """Spec-decode verification over the latent planes: request b's query row i (of q_b)
    sees positions < kv_b - q_b + i + 1; scores add q_rope . k_rope to q_nope . k_nope,
    values are the nope part (plain per-token loop as the reference)."""
    from vllm_npu.ops.sim import npu_fused_infer_attention_score

    L, R, N, scale = 512, 64, 8, 0.11
    kv_lens, q_lens = [5, 130, 260], [2, 4, 1]
    _, cache, bt, _ = _latent_setup(3, N, L, R, kv_lens, dtype)
    g = torch.Generator().manual_seed(7)
    T = sum(q_lens)
    q = torch.randn(T, N, L + R, generator=g).to(dtype)
    nope, rope = (p.reshape(p.shape[0], BS, -1) for p in _planes(cache, L))
    out, _ = npu_fused_infer_attention_score(
        q[..., :L].contiguous(), nope, nope, query_rope=q[..., L:].contiguous(),
        key_rope=rope, num_heads=N, num_key_value_heads=1, input_layout="TND",
        atten_mask=_causal_mask(), sparse_mode=3, scale=scale, block_table=bt,
        block_size=BS, actual_seq_lengths=[2, 6, 7], actual_seq_lengths_kv=kv_lens)
    t = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        for i in range(ql):
            visible = kl - ql + i + 1
            rows = torch.cat([cache[int(bt[b, p // BS]), p % BS] for p in range(visible)])
            scores = (q[t].float() @ rows.float().T) * scale
            want = torch.softmax(scores, -1) @ rows[:, :L].float()
            torch.testing.assert_close(out[t].float(), want, **TOL[dtype])
            t += 1


def test_fused_attention_mla_form_takes_at_most_16_query_tokens():
    from vllm_npu.ops.sim import npu_fused_infer_attention_score

    L, R, N = 512, 64, 8
    _, cache, bt, _ = _latent_setup(1, N, L, R, [40], torch.float32)
    nope, rope = (p.reshape(p.shape[0], BS, -1) for p in _planes(cache, L))
    q = torch.randn(17, N, L)
    with pytest.raises(NPUOpError, match="at most 16 query tokens per request, got 17"):
        npu_fused_infer_attention_score(
            q, nope, nope, query_rope=torch.randn(17, N, R), key_rope=rope, num_heads=N,
            num_key_value_heads=1, input_layout="TND", atten_mask=_causal_mask(),
            sparse_mode=3, scale=0.1, block_table=bt, block_size=BS,
            actual_seq_lengths=[17], actual_seq_lengths_kv=[40])


@pytest.mark.parametrize("heads,rope_dim,match", [
    (6, 64, r"query heads in \[1, 2, 4, 8, 16, 32, 64, 128\], got 6"),  # pad to 8
    (8, 32, "rope D 64, got D 512, rope 32"),
])
def test_fused_attention_mla_form_takes_its_documented_heads_and_rope(heads, rope_dim, match):
    """The MLA form: query D 512 with one kv head, query heads a power of two up to 128,
    rope D 64 (op-plugin FIA doc; ops-transformer's incre-flash tiling check)."""
    from vllm_npu.ops.sim import npu_fused_infer_attention_score

    L = 512
    _, cache, bt, _ = _latent_setup(1, 8, L, rope_dim, [40], torch.float32)
    nope, rope = (p.reshape(p.shape[0], BS, -1) for p in _planes(cache, L))
    with pytest.raises(NPUOpError, match=match):
        npu_fused_infer_attention_score(
            torch.randn(2, heads, L), nope, nope, query_rope=torch.randn(2, heads, rope_dim),
            key_rope=rope, num_heads=heads, num_key_value_heads=1, input_layout="TND",
            atten_mask=_causal_mask(), sparse_mode=3, scale=0.1, block_table=bt,
            block_size=BS, actual_seq_lengths=[2], actual_seq_lengths_kv=[40])
