"""The ``lookahead`` policy, the pigeonhole bound and the workload families."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy.bound import counts_fit, milp_bound, pigeonhole_counts
from vllm_npu.eplb.policy.exact import solve_layer
from benchmarks.eplb.families import (ALL_FAMILIES, REPORT_SEEDS, TUNING_SEEDS, FamilyConfig,
                                    generate_family)
from vllm_npu.eplb.policy.layer_solve import full_solve, layer_lower_bound, layer_peak
from vllm_npu.eplb.policy.metrics import imbalance, rank_loads
from vllm_npu.eplb.policy.lookahead import LookaheadPolicy
from vllm_npu.eplb.policy import get_policy

README = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                   [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]], float)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_families_are_seeded_and_respect_the_top_k_cap(family: str) -> None:
    cfg = FamilyConfig(family=family, num_layers=3, num_experts=64, num_ranks=8,
                       num_windows=2, sub_windows=3, seed=TUNING_SEEDS[0])
    data = generate_family(cfg)
    assert data.shape == (3, 3, 3, 64)
    assert np.array_equal(data, generate_family(cfg))
    picks = cfg.steps_per_sub * cfg.tokens_per_rank * cfg.num_ranks * cfg.top_k
    assert (data.sum(axis=-1) == picks).all()
    # one expert gets at most one of a token's top_k picks: share <= 1/top_k (+ noise)
    assert (data / picks).max() <= 1.0 / cfg.top_k + 0.01
    assert set(TUNING_SEEDS).isdisjoint(REPORT_SEEDS)


@pytest.mark.parametrize("seed", TUNING_SEEDS)
def test_steady_forgets_its_recent_past_and_walk_keeps_it(seed: int) -> None:
    """What sets the two tuned-on processes apart: on ``steady`` a window's last two
    sub-windows predict the next window's shares worse than the whole window does (measured:
    1.19-1.34 x its L1 error on the tuning seeds), on ``walk`` better (0.74-0.85 x)."""
    def shares(x):
        return x / x.sum(axis=-1, keepdims=True)

    for family in ("steady", "walk"):
        data = generate_family(FamilyConfig(family=family, num_layers=4, num_windows=3,
                                            seed=seed))
        for w in range(3):
            nxt = shares(data[w + 1].sum(axis=0))
            err_mean = np.abs(shares(data[w].sum(axis=0)) - nxt).sum(axis=-1).mean()
            err_recent = np.abs(shares(data[w, -2:].sum(axis=0)) - nxt).sum(axis=-1).mean()
            ratio = err_recent / err_mean
            assert ratio > 1.1 if family == "steady" else ratio < 0.9, (family, w, ratio)


def test_families_reject_an_unknown_family() -> None:
    with pytest.raises(ValueError, match="family must be one of"):
        generate_family(FamilyConfig(family="uniform"))


def test_bound_never_refutes_an_achievable_peak() -> None:
    """Validity: at the exact optimum of random small layers the pigeonhole program
    always finds counts (a refutation there would be a wrong bound)."""
    rng = np.random.default_rng(3)
    for experts, ranks, slots in [(6, 3, 3), (7, 4, 2), (10, 4, 3)]:
        for _ in range(3):
            load = np.round(rng.lognormal(0, 1.2, experts) * 50) + 1
            opt = layer_peak(load, solve_layer(load, ranks, slots, time_limit_s=30))
            assert counts_fit(load, ranks, slots, opt * (1 + 1e-9))
            assert layer_lower_bound(load, ranks, slots) <= opt * (1 + 1e-9)


def test_bound_sees_forced_pairs_the_simple_bound_misses() -> None:
    """31 equal experts on 20 ranks x 2 slots: 9 spare slots split 9 experts, so 22
    full-weight replicas need 20 ranks: two share one (peak 20), mean 15.5."""
    load = np.full(31, 10.0)
    simple = layer_lower_bound(load, 20, 2)
    assert simple == pytest.approx(15.5)
    peak = layer_peak(load, full_solve(load, 20, 2))
    assert peak == pytest.approx(20.0)
    bound = milp_bound(load, 20, 2, upper=peak)
    assert 19.9 <= bound <= peak


def test_pigeonhole_counts_fix_a_heavy_head() -> None:
    """A zipf layer (tuning seed) where water-filled counts force big replicas to pair."""
    data = generate_family(FamilyConfig(family="zipf", num_ranks=64, num_layers=8,
                                        seed=TUNING_SEEDS[1]))
    load = data[0, :, 1].sum(axis=0)
    lb = layer_lower_bound(load, 64, 5)
    water = layer_peak(load, full_solve(load, 64, 5)) / lb
    assert water > 1.15
    candidates = pigeonhole_counts(load, 64, 5, upper=water * lb)
    assert candidates and all(c.sum() == 320 and c.min() >= 1 and c.max() <= 64
                              for c in candidates)
    # (the risk descent and packing, off here, trade seen-window balance for risk)
    plan = get_policy("lookahead", risk_z=0.0, risk_pack=0).rebalance(data[0][:, 1:2], 64, 5)
    assert imbalance(load[None], plan, 64, 5)[0] <= 1.01


def _next_window_out(family: str, seed: int) -> dict[str, float]:
    """Mean OUT (next window's max/mean) of our FlashLB and of lookahead at its defaults
    (handed the earlier windows' totals, as the EPLB runtime does) over 3 rebalances on 32
    ranks x 9 slots; lookahead's IN (the window it saw) <= 1.05 (its cap 1.003 plus what the
    risk descent and risk packing trade for the next window)."""
    cfg = FamilyConfig(family=family, num_ranks=32, num_layers=4, num_windows=3, seed=seed)
    data = generate_family(cfg)
    totals = data.sum(axis=1)
    outs = {}
    for name in ("flashlb", "lookahead"):
        pol, prev, out = get_policy(name), None, []
        for w in range(cfg.num_windows):
            prev = pol.rebalance(data[w], 32, 9, old_phy2log=prev, history=totals[:w])
            out.append(imbalance(totals[w + 1], prev, 32, 9).mean())
            if name == "lookahead":
                assert imbalance(totals[w], prev, 32, 9).mean() <= 1.05
        outs[name] = float(np.mean(out))
    return outs


# Measured 2026-12-08 (defaults: count_mix 0.4, memory 0.45, temper 0.85), mean OUT,
# FlashLB -> lookahead: report seeds zipf 1.2194 -> 1.1943, lognormal 1.1934 -> 1.1615,
# bursty 1.4162 -> 1.4059; tuning seed zipf 1.1904 -> 1.1659, lognormal 1.1676 -> 1.1333,
# bursty 1.4664 -> 1.4532. Bursty had been behind (1.4207) until the replica counts were
# hedged (lookahead's ``temper``), and on the tuning seed until the counts leaned less on
# the forecast (count_mix 0.5: 1.4698).


@pytest.mark.parametrize("family,seeds", [
    ("zipf", "tuning"), ("lognormal", "tuning"),
    ("bursty", "tuning"),
    ("zipf", "report"), ("lognormal", "report"), ("bursty", "report")])
def test_lookahead_serves_the_next_window_better_than_flashlb(family: str, seeds: str) -> None:
    """The families whose drift is a walk: OUT (next window) below our FlashLB's, IN <=
    1.05 — on the tuning seed the defaults were chosen on, and on average over the report
    seeds, which nothing was tuned on. (The domain family jumps to a new mix at random: no
    window predicts it; memory's part there is the domain test below.)"""
    runs = [_next_window_out(family, s)
            for s in (TUNING_SEEDS[:1] if seeds == "tuning" else REPORT_SEEDS)]
    mean = {name: np.mean([r[name] for r in runs]) for name in runs[0]}
    assert mean["lookahead"] < mean["flashlb"], (family, seeds, runs)


def test_readme_example_at_the_exact_optimum_by_default() -> None:
    plan = get_policy("lookahead").rebalance(README, 8, 2)
    assert rank_loads(README, plan, 8).max(axis=1).tolist() == [136.0, 172.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_slot_enumeration_matches_the_milp(seed: int) -> None:
    """S = 2: the count enumeration (exact_pairs) against the MILP of exact.py."""
    import vllm_npu.eplb.policy.exact as exact_mod
    from vllm_npu.eplb.policy.exact_pairs import solve_two_slots

    load = np.random.default_rng(seed).integers(1, 200, 9).astype(float)
    fast = solve_two_slots(load, 6)
    assert fast is not None and all(len(set(row)) == 2 for row in fast)
    assert set(fast.ravel()) == set(range(9))
    saved, exact_mod.solve_two_slots = exact_mod.solve_two_slots, lambda *a: None
    try:
        milp = exact_mod.solve_layer(load, 6, 2, time_limit_s=60)
    finally:
        exact_mod.solve_two_slots = saved
    assert layer_peak(load, fast) == pytest.approx(layer_peak(load, milp), rel=1e-9)


def test_family_benchmark_writes_its_table(tmp_path) -> None:
    from benchmarks.eplb.bench_families import main

    out = tmp_path / "families.md"
    assert main(["--families", "lognormal", "--ranks", "16", "--layers", "2", "--windows",
                 "2", "--seeds", "tuning", "--policies", "flashlb", "lookahead",
                 "--out", str(out)]) == 0
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
            if line.startswith("| lognormal")]
    assert [r[4].strip() for r in rows] == ["flashlb", "lookahead"]
    assert {r[1].strip() for r in rows} == {"tuned"}  # lognormal: a family defaults saw
    for r in rows:
        inn, inn_star = float(r[5]), float(r[6])
        assert 1.0 <= inn_star <= inn + 1e-9   # the MILP bound is at least the simple one


def test_policy_options_are_checked_by_name_and_type() -> None:
    from vllm_npu.eplb.policy import policy_options

    assert policy_options("budget")["move_budget"] == 0.15
    assert get_policy("lookahead", move_budget=0.2).move_budget == 0.2
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['zz'\] for EPLB policy"):
        get_policy("swift", zz=1)
    with pytest.raises(ValueError, match="option 'z' must be a number, got 'high'"):
        get_policy("flashlb", z="high")
    # counts given as floats (a JSON 4.0) are counts; a fraction of one is refused
    assert get_policy("flashlb", depth=4.0).depth == 4 and \
        isinstance(get_policy("lookahead", scenarios=8.0).scenarios, int)
    with pytest.raises(ValueError, match="option 'depth' must be a whole number, got 2.5 "
                                         r"\(default 2\)"):
        get_policy("flashlb", depth=2.5)


def test_lookahead_move_budget_repairs_when_that_reaches_the_in_target() -> None:
    """With move_budget=0.2 a layer changes at most 20% of its slots whenever a repair that
    small brings the seen window to <= 1.02 x LB; it moves less than plain lookahead."""
    cfg = FamilyConfig(family="lognormal", num_ranks=32, num_layers=6, num_windows=3,
                       seed=TUNING_SEEDS[0])
    data = generate_family(cfg)
    totals = data.sum(axis=1)
    moved = {}
    for budget in (0.0, 0.2):
        pol, prev, moved[budget] = LookaheadPolicy(move_budget=budget), None, 0
        for w in range(cfg.num_windows):
            plan = pol.rebalance(data[w], 32, 9, old_phy2log=prev)
            if prev is not None:
                frac = (plan != prev).mean(axis=1)
                moved[budget] += int((plan != prev).sum())
                if budget:
                    small = frac <= 0.2
                    assert small.any()
                    assert (imbalance(totals[w], plan, 32, 9)[small] <= 1.02 + 1e-9).all()
            prev = plan
    assert moved[0.2] < moved[0.0]


def test_two_slot_enumeration_declines_what_it_cannot_certify() -> None:
    """3 equal experts on 3 ranks x 2: sorted pairing of counts (2, 2, 2) puts one expert
    twice on a rank, so the enumeration cannot certify peak 10 and leaves it to the MILP,
    which finds it ({0,1}, {1,2}, {0,2})."""
    from vllm_npu.eplb.policy.exact_pairs import solve_two_slots

    load = np.full(3, 10.0)
    assert solve_two_slots(load, 3) is None
    assert layer_peak(load, solve_layer(load, 3, 2)) == pytest.approx(10.0)


def _domain(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The domain family at 32 x 9 (6 layers, 6 windows): sub-windows and window totals."""
    data = generate_family(FamilyConfig(family="domain", num_ranks=32, num_layers=6,
                                        num_windows=6, seed=seed))
    return data, data.sum(axis=1)


def _domain_out(data: np.ndarray, totals: np.ndarray, memory: float,
                **options: float) -> float:
    """Mean OUT of windows 2-5, lookahead handed the earlier windows' totals when
    ``memory`` > 0."""
    pol, prev, out = LookaheadPolicy(memory=memory, **options), None, []
    for w in range(data.shape[0] - 1):
        prev = pol.rebalance(data[w], 32, 9, old_phy2log=prev,
                             history=totals[:w] if memory else None)
        if w >= 2:
            out.append(imbalance(totals[w + 1], prev, 32, 9).mean())
    return float(np.mean(out))


@pytest.mark.parametrize("memory,options", [
    (0.45, {}), (0.3, dict(temper=1.0, risk_z=0.0, risk_pack=0))],
    ids=["defaults", "memory-alone"])
def test_lookahead_memory_hedges_domain_jumps(memory: float, options: dict) -> None:
    """Domain family, over the tuning seed and every report seed: remembering earlier
    windows' shares (the ``history`` the caller hands in) lowers the next window's peak on
    average; the instance itself keeps nothing. Measured 2026-12-08 (count_mix 0.4), per seed
    without -> with memory: at the defaults (memory 0.45) 1.3570 -> 1.3087, 1.4450 ->
    1.4238, 1.2077 -> 1.1785, 1.4821 -> 1.3971, 1.3641 -> 1.3557, 1.4141 -> 1.4502 (mean
    1.3784 -> 1.3523); memory 0.3 alone (counts unhedged, no risk parts) 1.3824 -> 1.2826,
    1.5098 -> 1.4433, 1.1972 -> 1.1875, 1.5232 -> 1.4212, 1.3225 -> 1.3261, 1.4407 ->
    1.4568 (mean 1.3960 -> 1.3529). A jump no window predicts can go either way on one seed.
    """
    runs = [_domain(seed) for seed in (TUNING_SEEDS[0], *REPORT_SEEDS)]
    without = np.mean([_domain_out(*run, 0.0, **options) for run in runs])
    with_memory = np.mean([_domain_out(*run, memory, **options) for run in runs])
    assert with_memory < without, (without, with_memory)
    # no memory in the instance: the same call gives the same plan after other calls
    data, totals = runs[0]
    pol = LookaheadPolicy(memory=memory, **options)
    for w in range(3):
        pol.rebalance(data[w], 32, 9, history=totals[:w])
    assert np.array_equal(pol.rebalance(data[3], 32, 9, history=totals[:3]),
                          LookaheadPolicy(memory=memory, **options).rebalance(
                              data[3], 32, 9, history=totals[:3]))


def test_a_deadline_leaves_layers_their_quick_plan() -> None:
    """Anytime: with a deadline already past when planning starts, every layer keeps its
    quick plan (hedged counts, LPT packing, the risk descent; no scenario descent or count
    search) — valid, within 2% of LB on the seen window, and on the next window better than
    packing the seen window's own water-filled counts (the ``default``-style plan, computed
    here directly); with time, every layer gets its full plan instead."""
    from vllm_npu.eplb.policy.layer_solve import MAX_SWAPS
    from vllm_npu.eplb.policy.packing import packed_layer, water_fill
    from vllm_npu.eplb.policy.validate import check_placement

    cfg = FamilyConfig(family="lognormal", num_ranks=32, num_layers=6, num_windows=1,
                       seed=TUNING_SEEDS[0])
    data = generate_family(cfg)
    totals = data.sum(axis=1)
    pol = get_policy("lookahead")
    rushed = pol.rebalance(data[0], 32, 9, deadline_s=1e-9)
    check_placement(rushed, 6, 256, 32, 9, name="plan")
    assert imbalance(totals[0], rushed, 32, 9).max() <= 1.02
    plain = np.stack([packed_layer(totals[0, layer], water_fill(totals[0, layer], 32 * 9, 32),
                                   32, 9, MAX_SWAPS).ravel() for layer in range(6)])
    assert imbalance(totals[1], rushed, 32, 9).mean() < imbalance(totals[1], plain, 32, 9).mean()
    full = pol.rebalance(data[0], 32, 9, deadline_s=600.0)
    assert not np.array_equal(full, rushed)
    check_placement(full, 6, 256, 32, 9, name="plan")
    # an old plan no worse on the seen window is the quick plan itself (no moves)
    old = rushed[:, ::-1].copy()  # the same tables, slots reversed: same peaks
    assert np.array_equal(pol.rebalance(data[0], 32, 9, old_phy2log=old, deadline_s=1e-9), old)


def test_full_plans_hold_the_seen_window_nearer_its_bound() -> None:
    """What the time after the quick plans buys at the runtime's size (128 ranks x 3 slots,
    zipf: heavy heads): the scenario descent and the count search bring the seen window
    nearer its lower bound, on every tuning seed (2026-12-08, 6 layers, mean IN quick ->
    full: 1.0481 -> 1.0422, 1.0404 -> 1.0324, 1.0355 -> 1.0307; at 256 x 2, 1.17 -> 1.08).
    The next window is not reliably better for it: one window, OUT 1.3218 -> 1.3440,
    1.2987 -> 1.2815, 1.3019 -> 1.3363; over the 32 tuned-on cases (8 layers, 4
    rebalances) quick plans alone gave a geometric mean OUT of 0.9624 x va-flashlb's, full
    plans 0.9619."""
    for seed in TUNING_SEEDS:
        data = generate_family(FamilyConfig(family="zipf", num_ranks=128, num_layers=6,
                                            num_windows=1, seed=seed))
        seen = data[0].sum(axis=0)
        pol = get_policy("lookahead")
        rushed = pol.rebalance(data[0], 128, 3, deadline_s=1e-9)
        full = pol.rebalance(data[0], 128, 3, deadline_s=600.0)
        assert imbalance(seen, full, 128, 3).mean() < imbalance(seen, rushed, 128, 3).mean()


@pytest.mark.parametrize("seed", TUNING_SEEDS)
def test_risk_packing_serves_experts_that_rise_together(seed: int) -> None:
    """The ``groups`` process (experts rising and falling together) at 256 ranks x 2 slots:
    with the risk packing, lookahead's plans serve the next window better than without it,
    on every tuning seed (2026-12-07, 4 layers, 3 rebalances: 1.6658 -> 1.5922, 1.7920 ->
    1.7201, 1.6304 -> 1.5950), and every plan is a valid placement."""
    from vllm_npu.eplb.policy.validate import check_placement

    cfg = FamilyConfig(family="groups", num_ranks=256, num_layers=4, num_windows=3, seed=seed)
    data = generate_family(cfg)
    totals = data.sum(axis=1)
    outs = {}
    for risk_pack in (0, 1):
        pol, prev, out = get_policy("lookahead", risk_pack=risk_pack), None, []
        for w in range(cfg.num_windows):
            prev = pol.rebalance(data[w], 256, 2, old_phy2log=prev, history=totals[:w])
            check_placement(prev, 4, 256, 256, 2, name="plan")
            out.append(imbalance(totals[w + 1], prev, 256, 2).mean())
        outs[risk_pack] = np.mean(out)
    assert outs[1] < outs[0], outs
