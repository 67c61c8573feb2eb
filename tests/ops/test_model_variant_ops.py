"""The ops behind the architecture variants: FIA v2 with attention sinks (gpt-oss), the
clamped SwiGLU and biased experts (gpt-oss MoE), and the soft-capped attention composition
(Gemma 2), each against plain-PyTorch math written here, plus their refusals."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.attention import BS, MASK, SCENARIOS, make_paged, make_queries
from vllm_npu.attention.softcap import softcap_attention
from vllm_npu.moe.experts import FloatExperts, run_local_experts
from vllm_npu.ops.sim import npu_clipped_swiglu, npu_fused_infer_attention_score_v2_out
from vllm_npu.ops.sim.attention_v2 import (
    _npu_fused_infer_attention_score_v2_get_max_workspace,
    npu_fused_infer_attention_score_v2,
)
from vllm_npu.ops.sim.checks import NPUOpError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ref_attention(q, k, v, scale, *, window=None, sink=None, cap=None):
    """One request: q [ql, N, D], k/v [kl, Hkv, D]; right-down causal (+ band), an optional
    soft cap on the scores and per-head sink logits in the softmax denominator."""
    ql, n, _ = q.shape
    kl, hkv = k.shape[:2]
    kk = k.float().repeat_interleave(n // hkv, dim=1)
    vv = v.float().repeat_interleave(n // hkv, dim=1)
    out = torch.zeros(ql, n, v.shape[-1])
    for i in range(ql):
        last = kl - ql + i
        keys = [j for j in range(kl) if j <= last and (window is None or j > last - window)]
        for h in range(n):
            s = (kk[keys, h] * q[i, h].float()).sum(-1) * scale
            if cap is not None:
                s = cap * torch.tanh(s / cap)
            if sink is not None:
                s = torch.cat((s, sink[h].float().view(1)))
            p = torch.softmax(s, dim=0)[:len(keys)]
            out[i, h] = (p[:, None] * vv[keys, h]).sum(0)
    return out


def _v2_kwargs(paged, q_lens, kv_lens, n, hkv, scale, **extra):
    ends = [sum(q_lens[:b + 1]) for b in range(len(q_lens))]
    return dict(dict(atten_mask=MASK, actual_seq_qlen=ends, actual_seq_kvlen=list(kv_lens),
                     block_table=paged.block_table, num_query_heads=n,
                     num_key_value_heads=hkv, softmax_scale=scale, input_layout="TND",
                     sparse_mode=3, block_size=BS), **extra)


def _planes(paged, hkv, d):
    nb = paged.key_cache.shape[0]
    return paged.key_cache.view(nb, BS, hkv * d), paged.value_cache.view(nb, BS, hkv * d)


@pytest.mark.parametrize("scenario", ["mixed", "chunked_prefix_hit", "decode"])
@pytest.mark.parametrize("window", [None, 5])
def test_fia_v2_sinks_match_reference(scenario, window):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv, d = 4, 2, 16
    paged = make_paged(kv_lens, hkv, d, torch.float32)
    q = make_queries(q_lens, n, d, torch.float32)
    sink = torch.randn(n, generator=_gen(3)) * 2
    band = {} if window is None else dict(sparse_mode=4, pre_tokens=window - 1, next_tokens=0)
    kwargs = _v2_kwargs(paged, q_lens, kv_lens, n, hkv, d ** -0.5, **band)
    out, _ = npu_fused_infer_attention_score_v2(q, *_planes(paged, hkv, d),
                                                learnable_sink=sink, **kwargs)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        ref = _ref_attention(q[start:start + ql], paged.k[b], paged.v[b], d ** -0.5,
                             window=window, sink=sink)
        torch.testing.assert_close(out[start:start + ql], ref, atol=1e-5, rtol=1e-5)
        start += ql
    without, _ = npu_fused_infer_attention_score_v2(q, *_planes(paged, hkv, d), **kwargs)
    assert not torch.allclose(out, without)  # the sink takes probability mass


def test_fia_v2_out_writes_the_sinked_result_and_lse():
    q_lens, kv_lens = SCENARIOS["mixed"]
    n, hkv, d = 4, 2, 16
    paged = make_paged(kv_lens, hkv, d, torch.float32)
    q = make_queries(q_lens, n, d, torch.float32)
    sink = torch.randn(n, generator=_gen(4))
    kwargs = _v2_kwargs(paged, q_lens, kv_lens, n, hkv, 0.25, learnable_sink=sink,
                        return_softmax_lse=True)
    k, v = _planes(paged, hkv, d)
    out, lse = torch.empty_like(q), torch.empty(q.shape[0], n, 1)
    workspace = _npu_fused_infer_attention_score_v2_get_max_workspace(q, k, v, **kwargs)
    npu_fused_infer_attention_score_v2_out(q, k, v, out=[out, lse], workspace=workspace,
                                           **kwargs)
    want, want_lse = npu_fused_infer_attention_score_v2(q, k, v, **kwargs)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("bad, match", [
    (dict(learnable_sink=torch.zeros(3)), r"learnable_sink must be \[4\]"),
    (dict(learnable_sink=torch.zeros(4, dtype=torch.float16)), "learnable_sink must be"),
    (dict(learnable_sink=torch.zeros(4), input_layout="BSH"), "needs input_layout 'TND'"),
    (dict(num_heads=4), "v1's name; v2 takes 'num_query_heads'"),
])
def test_fia_v2_refuses(bad, match):
    q_lens, kv_lens = SCENARIOS["decode"]
    paged = make_paged(kv_lens, 2, 16, torch.float32)
    q = make_queries(q_lens, 4, 16, torch.float32)
    kwargs = _v2_kwargs(paged, q_lens, kv_lens, 4, 2, 0.25)
    kwargs.update(bad)
    with pytest.raises(NPUOpError, match=match):
        npu_fused_infer_attention_score_v2(q, *_planes(paged, 2, 16), **kwargs)


def test_fia_v2_sink_limits_value_head_dim_to_128():
    q_lens, kv_lens = [1], [5]
    paged = make_paged(kv_lens, 1, 144, torch.float32)
    q = make_queries(q_lens, 2, 144, torch.float32)
    kwargs = _v2_kwargs(paged, q_lens, kv_lens, 2, 1, 0.1, learnable_sink=torch.zeros(2))
    with pytest.raises(NPUOpError, match="value head dims up to 128, got 144"):
        npu_fused_infer_attention_score_v2(q, *_planes(paged, 1, 144), **kwargs)


# ------------------------------------------------------------------ clamped SwiGLU, biases


def _gpt_oss_glu(x, alpha=1.702, limit=7.0):
    """HF transformers' GptOssExperts activation, written out."""
    gate, up = x[..., ::2], x[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def test_clipped_swiglu_matches_gpt_oss():
    x = torch.randn(9, 64, generator=_gen(5)) * 6  # many values past the limit
    torch.testing.assert_close(npu_clipped_swiglu(x), _gpt_oss_glu(x))
    halves = torch.cat((x[..., ::2], x[..., 1::2]), dim=-1)
    torch.testing.assert_close(npu_clipped_swiglu(halves, interleaved=False), _gpt_oss_glu(x))
    with pytest.raises(NPUOpError, match="must be the last, of even size"):
        npu_clipped_swiglu(x[:, :63])


def test_biased_clipped_experts_match_dense_loop():
    experts, tokens, hidden, inter = 4, 11, 16, 8
    g = _gen(6)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g)
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.3
    b13 = torch.randn(experts, 2 * inter, generator=g)
    b2 = torch.randn(experts, hidden, generator=g)
    x = torch.randn(tokens, hidden, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=_gen(50 + t))[:2]
                       for t in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, 2, generator=g)
    ref = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(2):
            e = int(ids[t, j])
            h = _gpt_oss_glu(x[t] @ w13[e].T + b13[e])
            ref[t] += weights[t, j] * (h @ w2[e].T + b2[e])
    got = run_local_experts(x, weights, ids, FloatExperts(w13, w2, w13_bias=b13, w2_bias=b2,
                                                          clipped=True), 0, experts)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ soft-capped attention


@pytest.mark.parametrize("scenario", ["mixed", "chunked_prefix_hit", "empty_request_in_batch"])
@pytest.mark.parametrize("window", [None, 6])
def test_softcap_attention_matches_reference(scenario, window):
    q_lens, kv_lens = SCENARIOS[scenario]
    n, hkv, d, cap = 4, 2, 16, 1.5
    paged = make_paged(kv_lens, hkv, d, torch.float32)
    q = make_queries(q_lens, n, d, torch.float32) * 3  # scores well past the cap
    ends = [sum(q_lens[:b + 1]) for b in range(len(q_lens))]
    out = torch.zeros_like(q)
    softcap_attention(q, paged.key_cache, paged.value_cache, paged.block_table, ends,
                      list(kv_lens), d ** -0.5, cap, window, out)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        if ql:
            ref = _ref_attention(q[start:start + ql], paged.k[b], paged.v[b], d ** -0.5,
                                 window=window, cap=cap)
            torch.testing.assert_close(out[start:start + ql], ref, atol=1e-5, rtol=1e-5)
        start += ql
    plain = torch.zeros_like(q)  # a cap far above the scores: plain attention, other values
    softcap_attention(q, paged.key_cache, paged.value_cache, paged.block_table, ends,
                      list(kv_lens), d ** -0.5, 1e6, window, plain)
    assert not torch.allclose(out, plain, atol=1e-3)
