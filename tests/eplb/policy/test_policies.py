"""Every policy returns a valid placement on random and adversarial inputs."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers.eplb import assert_valid, lognormal_load

from vllm_npu.eplb.policy.metrics import imbalance, moved_slots, replica_counts
from vllm_npu.eplb.policy import get_policy

GEOMETRIES = [  # (E, D, S)
    (32, 8, 5),    # 8 spare slots
    (32, 8, 6),    # 2 spare per rank
    (32, 16, 2),   # E = D*S exactly: no spare
    (16, 4, 8),    # half the slots spare
    (6, 3, 6),     # S = E: every rank holds every expert
    (12, 1, 12),   # one rank
]


@pytest.mark.parametrize("e, d, s", GEOMETRIES)
def test_random_load_with_and_without_old(policy_name: str, e: int, d: int, s: int) -> None:
    rng = np.random.default_rng(e * 100 + d)
    pol = get_policy(policy_name)
    prev = None
    for _ in range(3):
        load = lognormal_load(rng, (3, 4, e))  # [T, L, E]
        plan = pol.rebalance(load, num_ranks=d, slots_per_rank=s, old_phy2log=prev)
        assert_valid(plan, 4, e, d, s)
        prev = plan


@pytest.mark.parametrize("e, d, s", GEOMETRIES)
def test_one_expert_carries_everything(policy_name: str, e: int, d: int, s: int) -> None:
    load = np.zeros((2, e))
    load[:, 1] = 1000.0
    plan = get_policy(policy_name).rebalance(load, num_ranks=d, slots_per_rank=s)
    assert_valid(plan, 2, e, d, s)
    if d * s - e >= d - 1:  # enough spare slots to put it on every rank
        assert (replica_counts(plan, e)[:, 1] == d).all()
        assert np.allclose(imbalance(load, plan, d, s), 1.0)


@pytest.mark.parametrize("e, d, s", GEOMETRIES)
def test_all_zero_load(policy_name: str, e: int, d: int, s: int) -> None:
    load = np.zeros((3, e))
    pol = get_policy(policy_name)
    plan = pol.rebalance(load, num_ranks=d, slots_per_rank=s)
    assert_valid(plan, 3, e, d, s)
    again = pol.rebalance(load, num_ranks=d, slots_per_rank=s, old_phy2log=plan)
    assert_valid(again, 3, e, d, s)


def test_many_sub_windows(policy_name: str) -> None:
    rng = np.random.default_rng(7)
    load = lognormal_load(rng, (64, 2, 24))
    plan = get_policy(policy_name).rebalance(load, num_ranks=6, slots_per_rank=5)
    assert_valid(plan, 2, 24, 6, 5)


def test_integer_and_2d_load_equivalent(policy_name: str) -> None:
    """A [L, E] load and the same load as one sub-window give the same plan (fresh
    instances: a policy may remember earlier windows, as lookahead does)."""
    rng = np.random.default_rng(3)
    load = rng.integers(0, 1000, size=(3, 20))
    a = get_policy(policy_name).rebalance(load, num_ranks=5, slots_per_rank=5)
    b = get_policy(policy_name).rebalance(load[None].astype(float), num_ranks=5,
                                          slots_per_rank=5)
    assert np.array_equal(a, b)


def test_deterministic(policy_name: str) -> None:
    rng = np.random.default_rng(11)
    load = lognormal_load(rng, (2, 5, 64), sigma=1.3)
    old = get_policy("default").rebalance(load[0], num_ranks=16, slots_per_rank=5)
    runs = [get_policy(policy_name).rebalance(load, 16, 5, old_phy2log=old) for _ in range(2)]
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("name, bound", [("flashlb", 1.02), ("swift", 1.02), ("budget", 1.02),
                                         ("default", 1.15)])
def test_balance_quality(name: str, bound: float) -> None:
    """A fresh plan on a skewed load lands close to the lower bound."""
    rng = np.random.default_rng(5)
    load = lognormal_load(rng, (6, 64), sigma=1.2)
    plan = get_policy(name).rebalance(load, num_ranks=16, slots_per_rank=6)
    assert imbalance(load, plan, 16, 6).mean() <= bound


def test_better_policies_beat_default() -> None:
    rng = np.random.default_rng(9)
    load = lognormal_load(rng, (8, 128), sigma=1.0)
    base = imbalance(load, get_policy("default").rebalance(load, 32, 5), 32, 5).mean()
    for name in ("flashlb", "swift"):
        assert imbalance(load, get_policy(name).rebalance(load, 32, 5), 32, 5).mean() < base


def _drifted(rng: np.random.Generator, load: np.ndarray, scale: float) -> np.ndarray:
    return np.round(load * rng.lognormal(0.0, scale, size=load.shape))


def test_incremental_policies_move_less_than_default() -> None:
    rng = np.random.default_rng(2)
    load = lognormal_load(rng, (6, 64), sigma=1.0)
    nxt = _drifted(rng, load, 0.05)
    old = get_policy("flashlb").rebalance(load, 16, 5)
    moves = {n: moved_slots(old, get_policy(n).rebalance(nxt, 16, 5, old_phy2log=old)).sum()
             for n in ("default", "swift", "budget", "flashlb")}
    assert moves["swift"] < moves["default"] and moves["budget"] < moves["default"]
    assert moves["flashlb"] < moves["default"]


def test_budget_respects_move_budget_and_keeps_balanced_layers() -> None:
    rng = np.random.default_rng(4)
    d, s = 16, 5
    load = lognormal_load(rng, (10, 64), sigma=1.0)
    pol = get_policy("budget")
    old = pol.rebalance(load, d, s)
    imb = imbalance(load, old, d, s)
    same = pol.rebalance(load, d, s, old_phy2log=old)
    keep = imb <= 1.0 + pol.keep_tol
    assert keep.any()
    assert (moved_slots(old, same)[keep] == 0).all()
    for scale in (0.1, 0.5, 2.0):
        new = pol.rebalance(_drifted(rng, load, scale), d, s, old_phy2log=old)
        assert (moved_slots(old, new) <= int(pol.move_budget * d * s)).all()


def test_flashlb_keeps_undegraded_layers() -> None:
    rng = np.random.default_rng(6)
    load = lognormal_load(rng, (8, 64))
    pol = get_policy("flashlb")
    old = pol.rebalance(load, 16, 5)
    keep = imbalance(load, old, 16, 5) <= 1.0 + pol.keep_tol
    assert keep.any()
    again = pol.rebalance(load, 16, 5, old_phy2log=old)
    assert np.array_equal(again[keep], old[keep])
