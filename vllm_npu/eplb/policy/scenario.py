"""Swap descent against several load scenarios at once (the ``lookahead`` policy's core).

A plan is served on a window nobody has seen yet, so it is judged on ``K`` load
scenarios: row 0 is the window that was seen (it must stay balanced: IN), rows 1.. are
guesses at the next one (a forecast, recent sub-windows). With ``m_k`` the largest rank
load under scenario ``k`` and ``w_k`` its weight (1 / its lower bound)::

    F = sum_{k >= 1} w_k m_k  +  penalty * max(0, w_0 m_0 - cap)

so the descent spends the slack the seen window leaves (``cap``, e.g. 1.003 x LB) on the
guesses. A move swaps one slot of a rank that is the hottest under some scenario with one
slot of another rank (no rank holds an expert twice). The largest load of the untouched
ranks comes from each scenario's top three, so a candidate costs ``O(K)``.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy._jit import njit
from vllm_npu.eplb.policy.packing import holds_table, swap_slots


@njit
def _objective(m: np.ndarray, wk: np.ndarray, cap: float, penalty: float) -> float:
    out = penalty * max(0.0, wk[0] * m[0] - cap)
    for k in range(1, m.shape[0]):
        out += wk[k] * m[k]
    return out


@njit
def _by_contribution(m: np.ndarray, wk: np.ndarray, cap: float) -> np.ndarray:
    """Scenarios by how much their peak weighs in the objective, largest first; the seen
    window first while it is above ``cap``."""
    key = np.zeros(m.shape[0])
    for k in range(m.shape[0]):
        key[k] = -wk[k] * m[k]
    key[0] = -1e300 if wk[0] * m[0] > cap else 1e300
    return np.argsort(key)


@njit
def _top3(loads: np.ndarray, top: np.ndarray) -> None:
    """``top[k]``: indices of the three largest ``loads[k]`` (first wins ties)."""
    k_count, d_count = loads.shape
    for k in range(k_count):
        a = -1
        b = -1
        c = -1
        for d in range(d_count):
            v = loads[k, d]
            if a < 0 or v > loads[k, a]:
                c = b
                b = a
                a = d
            elif b < 0 or v > loads[k, b]:
                c = b
                b = d
            elif c < 0 or v > loads[k, c]:
                c = d
        top[k, 0] = a
        top[k, 1] = b
        top[k, 2] = c


@njit
def scenario_descent(slots: np.ndarray, weight: np.ndarray, wk: np.ndarray, cap: float,
                     penalty: float, max_swaps: int, min_gain: float) -> int:
    """Improve ``slots`` ``[D, S]`` in place; ``weight`` ``[K, E]`` is each scenario's
    per-replica load. A swap must lower the objective by ``min_gain`` (relative).
    Returns the swaps made."""
    d_count, s_count = slots.shape
    k_count, e_count = weight.shape
    holds = holds_table(slots, e_count)
    loads = np.zeros((k_count, d_count))
    for k in range(k_count):
        for d in range(d_count):
            acc = 0.0
            for s in range(s_count):
                acc += weight[k, slots[d, s]]
            loads[k, d] = acc
    top = np.zeros((k_count, 3), np.int64)
    m = np.zeros(k_count)
    hot = np.zeros(k_count, np.int64)
    done = 0
    while done < max_swaps:
        _top3(loads, top)
        for k in range(k_count):
            m[k] = loads[k, top[k, 0]]
        cur = _objective(m, wk, cap, penalty)
        best = cur - min_gain * (1.0 + abs(cur))
        bh = -1
        bi = -1
        by = -1
        bj = -1
        n_hot = 0
        for k in _by_contribution(m, wk, cap):
            h = top[k, 0]
            seen = False
            for q in range(n_hot):
                if hot[q] == h:
                    seen = True
            if not seen:
                hot[n_hot] = h
                n_hot += 1
        for q in range(n_hot):
            if bh >= 0:
                break  # the hottest rank with an improving swap takes it (first improvement)
            h = hot[q]
            for i in range(s_count):
                a = slots[h, i]
                for y in range(d_count):
                    if y == h or holds[y, a]:
                        continue
                    for j in range(s_count):
                        b = slots[y, j]
                        if holds[h, b]:
                            continue
                        # Only a scenario whose hottest rank is h can lower its peak here;
                        # if none of them gets lighter on h, the swap cannot help.
                        helps = False
                        for k in range(k_count):
                            if top[k, 0] == h and weight[k, a] > weight[k, b]:
                                helps = True
                                break
                        if not helps:
                            continue
                        for k in range(k_count):
                            delta = weight[k, a] - weight[k, b]
                            v = max(loads[k, h] - delta, loads[k, y] + delta)
                            for t in range(3):
                                o = top[k, t]
                                if o < 0:
                                    break
                                if o != h and o != y:
                                    v = max(v, loads[k, o])
                                    break
                            m[k] = v
                        f = _objective(m, wk, cap, penalty)
                        if f < best:
                            best = f
                            bh = h
                            bi = i
                            by = y
                            bj = j
        if bh < 0:
            break
        a, b = swap_slots(slots, holds, bh, bi, by, bj)
        for k in range(k_count):
            delta = weight[k, a] - weight[k, b]
            loads[k, bh] -= delta
            loads[k, by] += delta
        done += 1
    return done


def table_objective(slots: np.ndarray, scenarios: np.ndarray, wk: np.ndarray, cap: float,
                    penalty: float) -> float:
    """The descent's objective ``F`` for a whole ``[D, S]`` table under load scenarios
    ``[K, E]`` (to compare tables the descent did not produce)."""
    cnt = np.maximum(np.bincount(slots.ravel(), minlength=scenarios.shape[1]), 1)
    peaks = (scenarios / cnt)[:, slots].sum(axis=2).max(axis=1)
    return float(_objective(peaks, wk, cap, penalty))
