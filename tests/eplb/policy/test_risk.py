"""The risk descent (vllm_npu/eplb/policy/risk.py) against risk computed here with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy.risk import risk_descent


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
