"""The risk packing, score and descent (vllm_npu/eplb/policy/risk.py) against risk and
peaks computed here with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy.packing import packed_layer
from vllm_npu.eplb.policy.risk import risk_descent, risk_pack, sub_window_score


def _rank_risk(slots: np.ndarray, sub: np.ndarray, z: float) -> np.ndarray:
    loads = sub[:, slots].sum(axis=2)  # [T, D]
    return loads.mean(axis=0) + z * loads.std(axis=0)


def test_experts_that_peak_together_are_moved_apart() -> None:
    """Two ranks x two slots over sub-windows that alternate A, B: experts 0 and 1 carry 4
    in A and nothing in B, experts 2 and 3 carry 3 in B. Paired as (0, 1) / (2, 3) each
    rank swings (risks 4 + 0.674 * 4 and 3 + 0.674 * 3); one swap pairs each A expert with a
    B expert: both ranks carry (4, 3), risk 3.5 + 0.674 * 0.5."""
    sub = np.array([[4.0, 4.0, 0.0, 0.0], [0.0, 0.0, 3.0, 3.0]] * 4)  # [T=8, E=4]
    slots = np.array([[0, 1], [2, 3]])
    before = _rank_risk(slots, sub, 0.674)
    swaps = risk_descent(slots, sub, np.zeros((0, 4)), np.zeros(0), 0.674, 8, 1e-9)
    assert before == pytest.approx([4.0 + 0.674 * 4.0, 3.0 + 0.674 * 3.0])
    assert swaps == 1
    assert _rank_risk(slots, sub, 0.674) == pytest.approx([3.5 + 0.674 * 0.5] * 2)
    assert sorted(slots.ravel().tolist()) == [0, 1, 2, 3]
    assert [sorted(set(row) & {0, 1}) for row in slots.tolist()] in ([[0], [1]], [[1], [0]])


def test_guards_hold_and_the_largest_risk_never_rises() -> None:
    rng = np.random.default_rng(3)
    e, d, s = 24, 6, 4
    sub = rng.gamma(2.0, 1.0, size=(8, e)) * rng.uniform(0.5, 2.0, size=e)
    seen = sub.sum(axis=0)
    slots = rng.permutation(e).reshape(d, s)
    peak = seen[slots].sum(axis=1).max()
    before = _rank_risk(slots, sub, 0.674).max()
    limit = np.array([peak * 1.01])
    risk_descent(slots, sub, seen[None], limit, 0.674, 100, 1e-9)
    assert sorted(slots.ravel().tolist()) == list(range(e))
    assert seen[slots].sum(axis=1).max() <= limit[0] + 1e-9
    assert _rank_risk(slots, sub, 0.674).max() <= before + 1e-9
    # a guard at the present peak: no swap may raise any rank above it
    slots2 = rng.permutation(e).reshape(d, s)
    tight = np.array([seen[slots2].sum(axis=1).max()])
    risk_descent(slots2, sub, seen[None], tight, 0.674, 100, 1e-9)
    assert seen[slots2].sum(axis=1).max() <= tight[0] + 1e-9


def _valid(slots: np.ndarray, cnt: np.ndarray) -> bool:
    """Every expert ``cnt[e]`` times, no rank holding one twice."""
    rows_unique = all(len(set(row)) == len(row) for row in slots.tolist())
    return rows_unique and np.array_equal(np.bincount(slots.ravel(), minlength=cnt.size), cnt)


def test_risk_pack_pairs_experts_that_take_turns() -> None:
    """Four experts of equal mean on two ranks x two slots: experts 0 and 2 carry 3 in
    sub-window A and 1 in B, experts 1 and 3 the reverse. LPT on the means (ties by id)
    pairs 0 with 2 and 1 with 3, so each sub-window has a rank at 6 and one at 2; the risk
    packing pairs an A expert with a B expert: every rank carries 4 in every sub-window."""
    sub = np.array([[3.0, 1.0, 3.0, 1.0], [1.0, 3.0, 1.0, 3.0]])
    cnt = np.ones(4, np.int64)
    weight = sub.sum(axis=0)
    plain = packed_layer(weight, cnt, 2, 2, 0)
    assert sub[:, plain].sum(axis=2).max() == 6.0
    slots = risk_pack(sub, weight, cnt, 2, 2, 0.674)
    assert _valid(slots, cnt)
    assert np.array_equal(sub[:, slots].sum(axis=2), np.full((2, 2), 4.0))


@pytest.mark.parametrize("seed", range(6))
def test_risk_pack_places_every_replica(seed: int) -> None:
    """Random counts (up to one replica per rank) and loads: every expert placed its count
    of times, never twice on a rank; with one sub-window and z = 0 the packing's peak is
    LPT's (the same greedy on a scalar load: least-loaded rank that lacks the expert)."""
    rng = np.random.default_rng(seed)
    d, s, e = 8, 5, 24
    cnt = np.ones(e, np.int64)
    while cnt.sum() < d * s:
        k = rng.integers(e)
        cnt[k] += cnt[k] < d
    sub = rng.gamma(1.5, 1.0, size=(6, e)) / cnt
    assert _valid(risk_pack(sub, sub.mean(axis=0), cnt, d, s, 0.674), cnt)
    one = sub.sum(axis=0, keepdims=True)
    slots = risk_pack(one, one[0], cnt, d, s, 0.0)
    plain = packed_layer(one[0] * cnt, cnt, d, s, 0)
    assert _valid(slots, cnt)
    assert one[0][slots].sum(axis=1).max() == pytest.approx(one[0][plain].sum(axis=1).max())


def test_risk_pack_makes_room_when_only_holders_have_room() -> None:
    """A case (found by search) where expert 2's third replica meets only ranks that
    already hold it: a full rank lacking it hands an expert over, as LPT does."""
    sub = np.array([[3.0, 1.0, 4.0, 1.0, 1.0, 0.0, 3.0], [0.0, 0.0, 3.0, 4.0, 0.0, 3.0, 1.0],
                    [3.0, 0.0, 1.0, 4.0, 2.0, 1.0, 0.0]])
    cnt = np.array([1, 1, 3, 1, 1, 1, 1])
    assert _valid(risk_pack(sub, sub.sum(axis=0) / cnt, cnt, 3, 3, 0.674), cnt)


def test_sub_window_score_is_the_mean_peak_over_mean() -> None:
    rng = np.random.default_rng(5)
    sub = rng.uniform(0.0, 2.0, size=(5, 12))
    slots = rng.permutation(12).reshape(4, 3)
    want = np.mean([max(sum(sub[t, e] for e in row) for row in slots.tolist())
                    / (sub[t].sum() / 4) for t in range(5)])
    assert sub_window_score(slots, sub) == pytest.approx(want)
