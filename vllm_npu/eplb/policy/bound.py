"""A true lower bound on a layer's best max rank load, stronger than ``max(mean, w/r)``.

``metrics.lower_bound`` ignores that every rank holds exactly ``S`` replicas, so when a
few replicas are large against the mean (small ``S``, heavy heads) no plan can reach it
and "IN 1.05" may already be optimal. This module proves better bounds by a pigeonhole
argument checked with a small integer program (scipy's HiGHS).

Let ``v_min = min_e load[e] / D`` (no expert has more than ``D`` replicas). If a plan has
max load ``<= t``, then for every ``j in 0..S-1`` at most ``j * D`` replicas weigh more than

    theta_j = (t - (S - 1 - j) * v_min) / (j + 1)

(otherwise some rank holds ``j + 1`` of them plus ``S - 1 - j`` others: load ``> t``).
Whether some replica counts ``k_e`` in ``[1, D]`` with ``sum k_e <= D * S`` meet all ``S``
of these limits is an integer program with one binary per expert and *level*: expert
``e`` either stays above ``theta_j`` (``k_e`` replicas count against level ``j``) or takes
``ceil(load[e] / theta_j)`` replicas to drop below it; only the smallest count of each
level range matters. When no counts fit, ``t`` is impossible: a lower bound. Bisection
between the simple bound and a known plan's peak gives the bound :func:`milp_bound`.

For layers small enough for :mod:`vllm_npu.eplb.policy.exact` the exact optimum is the bound.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from vllm_npu.eplb.policy import exact
from vllm_npu.eplb.policy.layer_solve import full_solve, layer_lower_bound, layer_peak


def _levels(load: np.ndarray, d: int, s: int, t: float, proven: bool = True) -> np.ndarray:
    """``theta_j`` for ``j = 0..S-1``.

    ``proven``: the ``S - 1 - j`` other replicas weigh at least ``v_min`` each (a bound).
    Otherwise they are taken as the lightest experts with one replica each, which is
    what good plans do: a heuristic for choosing counts, not a bound.
    """
    j = np.arange(s)
    if proven:
        fill = (s - 1 - j) * (float(load.min()) / d)
    else:
        light = np.concatenate([[0.0], np.cumsum(np.sort(load)[: s - 1])])
        fill = light[s - 1 - j]
    return (t - fill) / (j + 1)


def fit_counts(load: np.ndarray, num_ranks: int, slots_per_rank: int,
               t: float, proven: bool = True) -> tuple[bool, np.ndarray | None]:
    """``(fits, counts)``: ``fits`` is False when no replica counts meet the pigeonhole
    limits at max load ``t`` (so every plan's peak exceeds ``t``); otherwise ``counts``
    ``[E]`` are such counts (``sum <= D * S``; None if the solver stopped early)."""
    d, s = num_ranks, slots_per_rank
    theta = _levels(load, d, s, t, proven)
    if theta[0] <= 0:
        return False, None
    # Candidate counts per expert: 1 and the count that drops it below each level.
    e_count = load.shape[0]
    ks = np.concatenate([np.ones((e_count, 1)),
                         np.maximum(1.0, np.ceil(load[:, None] / theta[None, :] - 1e-12))], axis=1)
    ks.sort(axis=1)
    keep = (ks <= d) & (load[:, None] / ks <= theta[0] + 1e-12)  # level 0: none above theta_0
    keep[:, 1:] &= ks[:, 1:] != ks[:, :-1]                       # each count once
    if not keep.any(axis=1).all():
        return False, None
    experts, which = np.nonzero(keep)
    counts = ks[experts, which]
    weights = load[experts] / counts
    n = counts.size
    cand = np.arange(n)
    rows, cols, vals = [experts], [cand], [np.ones(n)]       # one count per expert
    lo, hi = [np.ones(e_count)], [np.ones(e_count)]
    rows.append(np.full(n, e_count))                          # slots
    cols.append(cand)
    vals.append(counts)
    lo.append([-np.inf])
    hi.append([float(d * s)])
    r = e_count + 1
    for j in range(1, s):                        # at most j*D replicas above theta_j
        big = np.flatnonzero(weights > theta[j] + 1e-12)
        if big.size == 0:
            continue
        rows.append(np.full(big.size, r))
        cols.append(big)
        vals.append(counts[big])
        lo.append([-np.inf])
        hi.append([float(j * d)])
        r += 1
    rows, cols, vals = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
    lo, hi = np.concatenate(lo), np.concatenate(hi)
    matrix = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
    res = milp(np.zeros(n), constraints=LinearConstraint(matrix, lo, hi),
               integrality=np.ones(n), bounds=Bounds(0, 1), options={"time_limit": 5.0})
    if res.status == 2:      # infeasible: t refuted
        return False, None
    if res.x is None:        # stopped early: t not refuted, no counts to offer
        return True, None
    out = np.zeros(load.shape[0], np.int64)
    chosen = np.rint(res.x) > 0.5
    out[experts[chosen]] = counts[chosen].astype(np.int64)
    return True, out


def counts_fit(load: np.ndarray, num_ranks: int, slots_per_rank: int, t: float) -> bool:
    """True unless max load ``t`` is refuted (see :func:`fit_counts`)."""
    return fit_counts(load, num_ranks, slots_per_rank, t)[0]


def pigeonhole_counts(load: np.ndarray, num_ranks: int, slots_per_rank: int,
                      upper: float, rel_tol: float = 5e-3) -> list[np.ndarray]:
    """Replica count vectors ``[E]`` (each summing to ``D * S``) that fit the pigeonhole
    limits at the max loads a bisection below ``upper`` visits, tightest last.

    The limits are necessary, not sufficient, so the tightest counts do not always pack
    best: callers pack each. Slots the program leaves over go, one at a time, to the
    expert with the heaviest replicas among those already below every level (they stay
    below) or, failing that, to the heaviest expert with fewer than ``D`` replicas.
    """
    load = np.asarray(load, dtype=np.float64)
    d, s = num_ranks, slots_per_rank
    lo, hi, found = layer_lower_bound(load, d, s), upper, []
    hi = max(hi, lo * (1.0 + 4 * rel_tol))
    while hi - lo > rel_tol * lo:
        mid = 0.5 * (lo + hi)
        fits, cnt = fit_counts(load, d, s, mid, proven=False)
        if fits:
            hi = mid
            if cnt is not None:
                found.append((cnt, mid))
        else:
            lo = mid
    out = []
    for cnt, t in found:
        cnt = cnt.copy()
        small_at = _levels(load, d, s, t, proven=False)[-1]
        for _ in range(d * s - int(cnt.sum())):
            per = load / cnt
            free = cnt < d
            safe = free & (per <= small_at)
            pick = np.where(safe if safe.any() else free, per, -1.0)
            cnt[int(pick.argmax())] += 1
        out.append(cnt)
    return out


def milp_bound(load: np.ndarray, num_ranks: int, slots_per_rank: int,
               upper: float | None = None, rel_tol: float = 1e-4) -> float:
    """Lower bound on the max rank load of any plan for one layer's ``load`` ``[E]``.

    ``upper`` is a known plan's peak (the search stops there); the result is within
    ``rel_tol`` of the best bound this argument proves, and never below the simple one.
    Layers small enough for :mod:`vllm_npu.eplb.policy.exact` get their exact optimum.
    """
    load = np.asarray(load, dtype=np.float64)
    d, s = num_ranks, slots_per_rank
    simple = layer_lower_bound(load, d, s)
    if simple <= 0:
        return 0.0
    if exact.is_small(load.shape[0], d, s):
        table = exact.solve_layer(load, d, s)
        if table is not None:
            return layer_peak(load, table)
    lo = simple
    hi = upper if upper is not None else layer_peak(load, full_solve(load, d, s))
    if counts_fit(load, d, s, lo * (1 + rel_tol)):
        return lo
    while hi - lo > rel_tol * lo:
        mid = 0.5 * (lo + hi)
        if counts_fit(load, d, s, mid):
            hi = mid
        else:
            lo = mid
    return lo
