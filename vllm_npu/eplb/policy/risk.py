"""Each rank's risk over the sub-windows: a packing, a score and a swap descent (``lookahead``).

A rank's load in the next window is uncertain, and more so when the experts it holds rise
and fall together. Over the ``T`` sub-windows of the seen window a rank ``d`` has loads
``L[t, d]``; its risk is ``mean_t L + z * std_t L`` (the covariance of its experts is in
the std: two experts that peak in the same sub-windows make it larger than two that take
turns). The descent lowers the largest risk by swapping a slot of that rank with a slot of
another, never letting a guard scenario (the seen window, the forecast) rise above its
limit. ``z`` = 0.674 (the 75th percentile of a normal) is vllm-ascend FlashLB's default
(``FlashLBConfig.z_score``), which scores mean + z * std per device likewise.

:func:`risk_pack` builds a table with that risk (an LPT whose cost is the rank's risk, not
its load), and :func:`sub_window_score` judges a table as FlashLB's ``compute_score``
does: the mean over sub-windows of the peak rank load over the mean rank load.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy._jit import njit
from vllm_npu.eplb.policy.metrics import rank_loads
from vllm_npu.eplb.policy.packing import holds_table, swap_slots


@njit
def _risk(col: np.ndarray, z: float) -> float:
    t_count = col.shape[0]
    mean = 0.0
    for t in range(t_count):
        mean += col[t]
    mean /= t_count
    var = 0.0
    for t in range(t_count):
        var += (col[t] - mean) ** 2
    return mean + z * np.sqrt(var / t_count)


def risk_pack(sub: np.ndarray, weight: np.ndarray, cnt: np.ndarray, num_ranks: int,
              slots_per_rank: int, z: float) -> np.ndarray:
    """A ``[D, S]`` table holding ``cnt[e]`` replicas of each expert: replicas by ``weight``
    (per-replica load), heaviest first (ties by expert id), each on the rank with a free
    slot, not yet holding its expert, whose risk over ``sub`` ``[T, E]`` (per-replica load
    in each sub-window) is least once it is added (ties: the lowest rank). Experts that
    peak together land apart; with ``z`` = 0 and one sub-window this is plain LPT.
    The order is sorted here, in numpy (numba's stable argsort costs seconds of JIT)."""
    reps = np.repeat(np.arange(cnt.shape[0]), cnt)
    order = reps[np.argsort(-weight[reps], kind="stable")]
    return _risk_pack(np.ascontiguousarray(sub, dtype=np.float64), order, num_ranks,
                      slots_per_rank, float(z))


@njit
def _risk_pack(sub: np.ndarray, order: np.ndarray, num_ranks: int, slots_per_rank: int,
               z: float) -> np.ndarray:
    t_count, e_count = sub.shape
    slots = np.empty((num_ranks, slots_per_rank), np.int64)
    fill = np.zeros(num_ranks, np.int64)
    holds = np.zeros((num_ranks, e_count), np.bool_)
    loads = np.zeros((num_ranks, t_count))
    for i in range(order.shape[0]):
        e = order[i]
        best = np.inf
        r = -1
        for d in range(num_ranks):
            if fill[d] >= slots_per_rank or holds[d, e]:
                continue
            s1 = 0.0  # one pass: sum and sum of squares of the rank's loads with e added
            s2 = 0.0
            for t in range(t_count):
                x = loads[d, t] + sub[t, e]
                s1 += x
                s2 += x * x
            mean = s1 / t_count
            v = mean + z * np.sqrt(max(s2 / t_count - mean * mean, 0.0))
            if v < best:
                best = v
                r = d
        if r < 0:  # every rank with room holds e: as packing._place_stuck
            r = _make_room(e, slots, fill, holds, loads, sub)
        slots[r, fill[r]] = e
        fill[r] += 1
        holds[r, e] = True
        for t in range(t_count):
            loads[r, t] += sub[t, e]
    return slots


@njit
def _make_room(e: int, slots: np.ndarray, fill: np.ndarray, holds: np.ndarray,
               loads: np.ndarray, sub: np.ndarray) -> int:
    """A full rank ``x`` lacking ``e`` exists (``e`` has at most ``D`` replicas); move one of
    its experts that a rank ``y`` with room lacks over to ``y`` (one exists: ``y`` holds
    ``e`` and ``x`` does not), freeing ``x``'s last slot for ``e``; returns ``x``."""
    d_count, s_count = slots.shape
    y = 0
    while fill[y] >= s_count:
        y += 1
    for x in range(d_count):
        if holds[x, e] or fill[x] < s_count:
            continue
        for k in range(s_count):
            f = slots[x, k]
            if holds[y, f]:
                continue
            slots[y, fill[y]] = f
            fill[y] += 1
            holds[y, f] = True
            holds[x, f] = False
            slots[x, k] = slots[x, s_count - 1]  # the freed slot becomes the last
            fill[x] -= 1
            for t in range(sub.shape[0]):
                loads[y, t] += sub[t, f]
                loads[x, t] -= sub[t, f]
            return x
    return -1


def sub_window_score(slots: np.ndarray, sub: np.ndarray) -> float:
    """Mean over sub-windows ``sub`` ``[T, E]`` (expert loads, split over the table's own
    replicas) of the peak rank load over the mean rank load: vllm-ascend FlashLB's
    ``compute_score`` (policy_flashlb.py)."""
    d = slots.shape[0]
    loads = rank_loads(sub, np.broadcast_to(slots.ravel(), (sub.shape[0], slots.size)), d)
    return float((loads.max(axis=1) / np.maximum(loads.mean(axis=1), 1e-300)).mean())


@njit
def risk_descent(slots: np.ndarray, sub: np.ndarray, guard: np.ndarray, limit: np.ndarray,
                 z: float, max_swaps: int, min_gain: float) -> int:
    """Improve ``slots`` ``[D, S]`` in place. ``sub`` ``[T, E]``: per-replica load of each
    sub-window; ``guard`` ``[G, E]``: per-replica loads whose rank loads must stay at or
    below ``limit[g]``. A swap takes the riskiest rank's risk and its partner's below the
    riskiest's by ``min_gain`` (relative): the largest risk never rises, and ties at the top
    are worked off one rank at a time. Partners are ranks already less risky than the
    riskiest (a pruning: two ranks tied at the top are not swapped with each other).
    Returns the swaps made."""
    d_count, s_count = slots.shape
    t_count, e_count = sub.shape
    g_count = guard.shape[0]
    holds = holds_table(slots, e_count)
    loads = np.zeros((d_count, t_count))
    gl = np.zeros((g_count, d_count))
    for d in range(d_count):
        for s in range(s_count):
            e = slots[d, s]
            for t in range(t_count):
                loads[d, t] += sub[t, e]
            for g in range(g_count):
                gl[g, d] += guard[g, e]
    risk = np.zeros(d_count)
    for d in range(d_count):
        risk[d] = _risk(loads[d], z)
    col_h = np.zeros(t_count)
    col_y = np.zeros(t_count)
    done = 0
    while done < max_swaps:
        h = 0
        for d in range(1, d_count):
            if risk[d] > risk[h]:
                h = d
        best = risk[h] * (1.0 - min_gain)
        bi = -1
        by = -1
        bj = -1
        for i in range(s_count):
            a = slots[h, i]
            for y in range(d_count):
                if y == h or holds[y, a] or risk[y] >= best:
                    continue
                for j in range(s_count):
                    b = slots[y, j]
                    if holds[h, b]:
                        continue
                    ok = True
                    for g in range(g_count):
                        dg = guard[g, a] - guard[g, b]
                        if gl[g, h] - dg > limit[g] or gl[g, y] + dg > limit[g]:
                            ok = False
                            break
                    if not ok:
                        continue
                    for t in range(t_count):
                        delta = sub[t, a] - sub[t, b]
                        col_h[t] = loads[h, t] - delta
                        col_y[t] = loads[y, t] + delta
                    v = max(_risk(col_h, z), _risk(col_y, z))
                    if v < best:  # h cools and y stays below h's old risk
                        best = v
                        bi = i
                        by = y
                        bj = j
        if bi < 0:
            break
        a, b = swap_slots(slots, holds, h, bi, by, bj)
        for t in range(t_count):
            delta = sub[t, a] - sub[t, b]
            loads[h, t] -= delta
            loads[by, t] += delta
        for g in range(g_count):
            dg = guard[g, a] - guard[g, b]
            gl[g, h] -= dg
            gl[g, by] += dg
        risk[h] = _risk(loads[h], z)
        risk[by] = _risk(loads[by], z)
        done += 1
    return done
