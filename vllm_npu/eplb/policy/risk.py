"""Swap descent on each rank's risk over the sub-windows (``lookahead``'s last stage).

A rank's load in the next window is uncertain, and more so when the experts it holds rise
and fall together. Over the ``T`` sub-windows of the seen window a rank ``d`` has loads
``L[t, d]``; its risk is ``mean_t L + z * std_t L`` (the covariance of its experts is in
the std: two experts that peak in the same sub-windows make it larger than two that take
turns). The descent lowers the largest risk by swapping a slot of that rank with a slot of
another, never letting a guard scenario (the seen window, the forecast) rise above its
limit. ``z`` = 0.674 (the 75th percentile of a normal) is vllm-ascend FlashLB's default
(``FlashLBConfig.z_score``), which scores mean + z * std per device likewise.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy._jit import njit
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
