"""Simulated MoE ops (gating top-k, init-routing v2, grouped matmul, token unpermute) and
the rank's expert pipeline against references written here: routing math in plain
float32 PyTorch and a dense MoE that loops over every expert."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.moe.experts import FloatExperts, run_local_experts
from vllm_npu.ops.sim import (
    npu_grouped_matmul,
    npu_moe_gating_top_k,
    npu_moe_init_routing_v2,
    npu_moe_token_unpermute,
)
from vllm_npu.ops.sim.checks import NPUOpError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------- references


def _ref_routing(logits, k, *, sigmoid, bias=None, groups=1, topk_group=1, top2_groups=False,
                 renorm=False, scale=1.0):
    """HF-style routing (DeepSeek-V3's MoEGate / Qwen3's router), one token at a time."""
    weights, ids = [], []
    for row in logits.float():
        scores = row.sigmoid() if sigmoid else row.softmax(-1)
        choice = scores + bias.float() if bias is not None else scores.clone()
        if groups > 1:
            per = row.numel() // groups
            g = choice.view(groups, per)
            gscore = g.topk(2).values.sum(-1) if top2_groups else g.max(-1).values
            keep = set(gscore.topk(topk_group).indices.tolist())
            for gi in range(groups):
                if gi not in keep:
                    choice[gi * per:(gi + 1) * per] = float("-inf")
        idx = choice.topk(k).indices
        w = scores[idx]
        if renorm:
            w = w / w.sum()
        weights.append(w * scale)
        ids.append(idx)
    return torch.stack(weights), torch.stack(ids)


def _dense_moe(x, weights, ids, w13, w2):
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) with every expert looped; w13 [E, 2I, H]
    (gate | up), w2 [E, H, I], SwiGLU."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(w13.shape[0]):
        gate, up = (x.float() @ w13[e].float().T).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].float().T
        for j in range(ids.shape[1]):
            hit = ids[:, j] == e
            out[hit] += weights[hit, j:j + 1].float() * y[hit]
    return out


# ---------------------------------------------------------------------- gating top-k


@pytest.mark.parametrize("case", [
    dict(sigmoid=False, k=2, experts=8),                                    # Qwen3-MoE
    dict(sigmoid=False, k=8, experts=8),                                    # top-k = E
    dict(sigmoid=True, k=2, experts=8, bias=True, groups=2, topk_group=1,
         top2_groups=True, scale=2.5),                                      # DeepSeek-V3
    dict(sigmoid=False, k=3, experts=12, groups=3, topk_group=2),           # DeepSeek-V2
    dict(sigmoid=True, k=4, experts=16, bias=True, groups=4, topk_group=2,
         top2_groups=True),
], ids=["softmax", "softmax-k=E", "dsv3", "dsv2-groups", "sigmoid-groups"])
def test_gating_top_k_matches_reference(case):
    e, k = case["experts"], case["k"]
    logits = torch.randn(33, e, generator=_gen(1))
    bias = torch.randn(e, generator=_gen(2)) * 0.1 if case.get("bias") else None
    groups = case.get("groups", 1)
    y, idx, norm = npu_moe_gating_top_k(
        logits, k, bias=bias, k_group=case.get("topk_group", 1), group_count=groups,
        group_select_mode=1 if case.get("top2_groups") else 0,
        norm_type=1 if case["sigmoid"] else 0, routed_scaling_factor=case.get("scale", 1.0))
    ref_w, ref_ids = _ref_routing(logits, k, sigmoid=case["sigmoid"], bias=bias, groups=groups,
                                  topk_group=case.get("topk_group", 1),
                                  top2_groups=case.get("top2_groups", False),
                                  renorm=case["sigmoid"], scale=case.get("scale", 1.0))
    assert idx.dtype == torch.int32 and norm.dtype == torch.float32
    assert torch.equal(idx.long(), ref_ids)  # sorted by (biased) score, like topk
    torch.testing.assert_close(y, ref_w, atol=1e-6, rtol=1e-6)
    expected_norm = logits.sigmoid() if case["sigmoid"] else logits.softmax(-1)
    torch.testing.assert_close(norm, expected_norm)


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=2, renorm=1), "renorm=1"),
    (dict(k=2, norm_type=2), "norm_type=2"),
    (dict(k=2, group_count=3), "group_count=3"),        # 8 experts do not split in 3
    (dict(k=2, group_count=4), "group_count=4"),        # groups of 2: must be > 2
    (dict(k=2, group_count=2, k_group=3), "k_group=3"),
    (dict(k=5, group_count=2, k_group=1), "k=5"),       # only 4 experts in one group
    (dict(k=2, bias=torch.zeros(8, dtype=torch.float64)), "bias"),
])
def test_gating_top_k_refuses(kwargs, match):
    with pytest.raises(NPUOpError, match=match):
        npu_moe_gating_top_k(torch.randn(4, 8), **kwargs)
    with pytest.raises(NPUOpError, match="at most 2048"):
        npu_moe_gating_top_k(torch.randn(1, 2049), 1)


# ---------------------------------------------------------------------- init routing v2


def test_init_routing_v2_index_formats_and_range():
    """Pairs f = t*K + j sorted stably by expert; out-of-range experts dropped (-1)."""
    x = torch.arange(4, dtype=torch.float32).unsqueeze(1).repeat(1, 3)  # row t = t
    ids = torch.tensor([[2, 0], [1, 2], [0, 3], [2, 1]], dtype=torch.int32)
    ex, row_idx, counts, _ = npu_moe_init_routing_v2(
        x, ids, active_num=8, expert_num=4, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, 3])
    # expert 0: f=1 (t0), f=4 (t2); expert 1: f=2 (t1), f=7 (t3); expert 2: f=0, 3, 6
    assert counts.tolist() == [2, 2, 3]
    assert row_idx.tolist() == [4, 0, 2, 5, 1, -1, 6, 3]
    assert ex[:7, 0].tolist() == [0, 2, 1, 3, 0, 1, 3]
    assert torch.isnan(ex[7:]).all()  # undefined rows past the kept pairs
    _, scatter, _, _ = npu_moe_init_routing_v2(
        x, ids, active_num=8, expert_num=4, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, row_idx_type=1)
    assert scatter.tolist() == [1, 4, 2, 7, 0, 3, 6, 5]  # destination -> source pair


def test_init_routing_v2_refuses():
    x, ids = torch.randn(2, 4), torch.tensor([[0, 1], [1, 3]], dtype=torch.int32)
    ok = dict(active_num=4, expert_num=4, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    for bad, match in ((dict(expert_num=3), "expert ids"), (dict(drop_pad_mode=1), "drop_pad"),
                       (dict(expert_tokens_num_flag=False), "flag"),
                       (dict(quant_mode=1), "quant_mode"),
                       (dict(active_expert_range=[2, 1]), "active_expert_range")):
        with pytest.raises(NPUOpError, match=match):
            npu_moe_init_routing_v2(x, ids, **(ok | bad))
    with pytest.raises(NPUOpError, match="int32"):
        npu_moe_init_routing_v2(x, ids.long(), **ok)


# ---------------------------------------------------------------------- grouped matmul


def test_grouped_matmul_counts_and_cumsum():
    x = torch.randn(10, 6, generator=_gen(3))
    w = torch.randn(3, 6, 5, generator=_gen(4))
    counts = torch.tensor([4, 0, 5])  # expert 1 gets no rows; row 9 is past every group
    ref = torch.cat([x[:4] @ w[0], x[4:9] @ w[2]])
    for group_list, kind in ((counts, 1), (counts.cumsum(0), 0)):
        (y,) = npu_grouped_matmul([x], [w], group_list=group_list, split_item=2,
                                  group_type=0, group_list_type=kind)
        torch.testing.assert_close(y[:9], ref)
        assert torch.isnan(y[9]).all()
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)  # a transposed weight view is fine
    (y,) = npu_grouped_matmul([x], [wt], group_list=counts, split_item=2, group_type=0,
                              group_list_type=1)
    torch.testing.assert_close(y[:9], ref)


def test_grouped_matmul_refuses():
    x, w, gl = torch.randn(4, 6), torch.randn(2, 6, 3), torch.tensor([2, 2])
    ok = dict(group_list=gl, split_item=2, group_type=0, group_list_type=1)
    for bad, match in ((dict(group_type=None), "group_type"), (dict(split_item=0), "split_item"),
                       (dict(group_list=torch.tensor([3, 2])), "within the 4 rows"),
                       (dict(group_list=gl.int()), "int64"),
                       (dict(scale=[torch.ones(2, 3)]), "quantized")):
        with pytest.raises(NPUOpError, match=match):
            npu_grouped_matmul([x], [w], **(ok | bad))
    with pytest.raises(NPUOpError, match="contiguous"):
        npu_grouped_matmul([torch.randn(6, 4).T], [w], **ok)


# ---------------------------------------------------------------------- unpermute


def test_unpermute_weighted_sum_and_refusals():
    rows = torch.randn(6, 4, generator=_gen(5))
    idx = torch.tensor([3, 0, 5, 1, 4, 2], dtype=torch.int32)
    probs = torch.rand(3, 2, generator=_gen(6))
    out = npu_moe_token_unpermute(rows, idx, probs)
    ref = torch.stack([probs[t, 0] * rows[idx[2 * t]] + probs[t, 1] * rows[idx[2 * t + 1]]
                       for t in range(3)])
    torch.testing.assert_close(out, ref)
    with pytest.raises(NPUOpError, match="distinct"):
        npu_moe_token_unpermute(rows, torch.tensor([0, 0, 1, 2, 3, 4], dtype=torch.int32), probs)
    with pytest.raises(NPUOpError, match="distinct"):
        npu_moe_token_unpermute(rows, torch.tensor([0, -1, 1, 2, 3, 4], dtype=torch.int32),
                                probs)


# ---------------------------------------------------------------------- the whole rank


def _experts(num, hidden=16, inter=8, seed=7):
    g = _gen(seed)
    return torch.randn(num, 2 * inter, hidden, generator=g) * 0.3, \
        torch.randn(num, hidden, inter, generator=g) * 0.3


@pytest.mark.parametrize("routing", ["random", "one-expert", "k=E", "empty-experts"])
def test_local_experts_match_dense_moe(routing):
    """Every expert's share, including experts with no tokens and one taking them all,
    equals the dense loop; split over two 'ranks' the partial outputs sum to it."""
    experts, k, tokens = 6, 2, 17
    w13, w2 = _experts(experts)
    x = torch.randn(tokens, 16, generator=_gen(8))
    if routing == "random":
        ids = torch.stack([torch.randperm(experts, generator=_gen(100 + t))[:k]
                           for t in range(tokens)])
    elif routing == "one-expert":
        ids = torch.tensor([[4, 1]] * tokens)
    elif routing == "k=E":
        k = experts
        ids = torch.stack([torch.randperm(experts, generator=_gen(200 + t))
                           for t in range(tokens)])
    else:
        ids = torch.tensor([[0, 5]] * tokens)
    weights = torch.rand(tokens, k, generator=_gen(9))
    ids = ids.to(torch.int32)
    ref = _dense_moe(x, weights, ids, w13, w2)
    full = run_local_experts(x, weights, ids, FloatExperts(w13, w2), 0, experts)
    torch.testing.assert_close(full, ref, atol=1e-5, rtol=1e-5)
    half = experts // 2
    parts = [run_local_experts(x, weights, ids, FloatExperts(w13[r * half:(r + 1) * half],
                                                             w2[r * half:(r + 1) * half]),
                               r * half, experts)
             for r in range(2)]
    torch.testing.assert_close(parts[0] + parts[1], ref, atol=1e-5, rtol=1e-5)
    assert not any(torch.isnan(p).any() for p in parts)  # undefined rows never leak
    # one slot per rank (E experts over EP E): a single group goes as a cumsum list
    singles = [run_local_experts(x, weights, ids, FloatExperts(w13[r:r + 1], w2[r:r + 1]),
                                 r, experts) for r in range(experts)]
    torch.testing.assert_close(sum(singles), ref, atol=1e-5, rtol=1e-5)


def test_grouped_matmul_refuses_a_count_list_of_one_group():
    """op-plugin's npu_grouped_matmul doc: with group_list_type 1 "the length cannot be 1";
    the same single group as a cumulative end (type 0) is taken."""
    x, w = torch.randn(4, 6, generator=_gen(10)), torch.randn(1, 6, 3, generator=_gen(11))
    gl = torch.tensor([3])
    with pytest.raises(NPUOpError, match="cannot have length 1"):
        npu_grouped_matmul([x], [w], group_list=gl, split_item=2, group_type=0,
                           group_list_type=1)
    (y,) = npu_grouped_matmul([x], [w], group_list=gl, split_item=2, group_type=0,
                              group_list_type=0)
    torch.testing.assert_close(y[:3], x[:3] @ w[0])


def test_int8_local_experts_match_the_fake_quant_loop():
    """W8A8_DYNAMIC experts (int8 weights, per-channel scales, per-token activations)
    equal tests/helpers/reference_quant.py's per-token, per-expert loop; split over two 'ranks'
    the partial outputs sum to it."""
    from tests.helpers.reference_quant import FakeQuantExperts
    from vllm_npu.moe.experts import Int8Experts

    experts, k, tokens, hidden, inter = 6, 2, 17, 16, 8
    w13, w2 = _experts(experts, hidden, inter)
    q13 = torch.round(w13 / (w13.abs().amax(-1, keepdim=True) / 127)).to(torch.int8)
    s13 = (w13.abs().amax(-1) / 127)
    q2 = torch.round(w2 / (w2.abs().amax(-1, keepdim=True) / 127)).to(torch.int8)
    s2 = (w2.abs().amax(-1) / 127)
    ckpt = {}
    for e in range(experts):
        p = f"experts.{e}"
        ckpt.update({f"{p}.gate_proj.weight": q13[e, :inter], f"{p}.up_proj.weight": q13[e, inter:],
                     f"{p}.down_proj.weight": q2[e], f"{p}.gate_proj.weight_scale": s13[e, :inter],
                     f"{p}.up_proj.weight_scale": s13[e, inter:],
                     f"{p}.down_proj.weight_scale": s2[e]})
    x = torch.randn(tokens, hidden, generator=_gen(8))
    x[3] = 0.0  # a zero row quantises to zeros
    ids = torch.stack([torch.randperm(experts, generator=_gen(300 + t))[:k]
                       for t in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, k, generator=_gen(9))
    ref = FakeQuantExperts(ckpt, "experts")(x, ids, weights)
    full = run_local_experts(x, weights, ids, Int8Experts(q13, q2, s13, s2), 0, experts)
    torch.testing.assert_close(full, ref, atol=1e-6, rtol=1e-6)
    half = experts // 2
    shards = [Int8Experts(*(t[r * half:(r + 1) * half] for t in (q13, q2, s13, s2)))
              for r in range(2)]
    parts = [run_local_experts(x, weights, ids, shards[r], r * half, experts)
             for r in range(2)]
    torch.testing.assert_close(parts[0] + parts[1], ref, atol=1e-6, rtol=1e-6)
    assert not (full == 0).all()


# ---------------------------------------------------------------------- layer routing


def _layer(**kw):
    from types import SimpleNamespace

    base = dict(scoring_func="softmax", renormalize=True, use_grouped_topk=False,
                num_expert_group=None, topk_group=None, top_k=2, e_score_correction_bias=None,
                routed_scaling_factor=1.0, custom_routing_function=None,
                apply_router_weight_on_input=False)
    return SimpleNamespace(**(base | kw))


@pytest.mark.parametrize("kw, ref", [
    (dict(), dict(sigmoid=False, renorm=True)),                               # Qwen3-MoE
    (dict(renormalize=False, routed_scaling_factor=2.0),
     dict(sigmoid=False, scale=2.0)),                                          # DeepSeek-V2
    (dict(routed_scaling_factor=1.5), dict(sigmoid=False, renorm=True, scale=1.5)),
    (dict(scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=2, topk_group=1,
          e_score_correction_bias=torch.linspace(-0.1, 0.1, 8)),
     dict(sigmoid=True, renorm=True, groups=2, topk_group=1, top2_groups=True,
          bias=torch.linspace(-0.1, 0.1, 8))),                                 # DeepSeek-V3
])
def test_select_experts_matches_reference(kw, ref):
    from vllm_npu.moe.routing import select_experts

    logits = torch.randn(21, 8, generator=_gen(11))
    weights, ids = select_experts(_layer(**kw), torch.zeros(21, 4), logits)
    ref_w, ref_ids = _ref_routing(logits, 2, **ref)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_w, atol=1e-6, rtol=1e-6)


def test_custom_routing_function_runs_as_the_model_wrote_it():
    """Llama 4's router (sigmoid of the top-1 logit, written here) replaces the gating op;
    with the weight applied on the input, top-1 is the only valid form."""
    from vllm_npu.moe.routing import routing_problems, select_experts

    def sigmoid_top1(hidden_states, gating_output, topk, renormalize):
        scores, ids = gating_output.topk(topk, dim=-1)
        return scores.float().sigmoid(), ids

    logits = torch.randn(21, 8, generator=_gen(12))
    layer = _layer(custom_routing_function=sigmoid_top1, top_k=1, renormalize=False,
                   apply_router_weight_on_input=True, scoring_func="sqrtsoftplus")
    assert routing_problems(layer, 8) == []  # the gating op's limits do not apply
    weights, ids = select_experts(layer, torch.zeros(21, 4), logits)
    assert ids.dtype == torch.int32
    assert torch.equal(ids.long().squeeze(1), logits.argmax(-1))
    torch.testing.assert_close(weights.squeeze(1), logits.max(-1).values.sigmoid())


def test_routing_problems_name_the_setting():
    from vllm_npu.moe.routing import routing_problems

    assert routing_problems(_layer(), 8) == []
    cases = [(dict(scoring_func="sqrtsoftplus"), 8, "scoring_func='sqrtsoftplus'"),
             (dict(scoring_func="sigmoid", renormalize=False), 8, "without renormalisation"),
             (dict(use_grouped_topk=True, num_expert_group=4, topk_group=1), 8, "n_group=4"),
             (dict(use_grouped_topk=True, num_expert_group=2, topk_group=1, top_k=5), 8,
              "top_k=5"),
             (dict(apply_router_weight_on_input=True), 8, "on the input with top_k=2"),
             (dict(), 4096, "at most 2048")]
    for kw, experts, match in cases:
        problems = routing_problems(_layer(**kw), experts)
        assert any(match in p for p in problems), (kw, problems)
