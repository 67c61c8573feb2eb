"""Repair an existing placement with few moves (shared by ``swift`` and ``budget``).

Two move kinds, each counted in moved slots (weights a rank must receive)::

    retarget (1 move):  rank r [ .. d .. ]  ->  [ .. a .. ]   cold replica d becomes hot expert a
    swap     (2 moves): rank h [ .. a .. ]      rank y [ .. b .. ]  ->  a <-> b
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy._jit import njit
from vllm_npu.eplb.policy.packing import holds_table, rank_loads, swap_descent


@njit
def retarget_replicas(slots: np.ndarray, load: np.ndarray, cnt: np.ndarray,
                      limit: float, max_moves: int) -> int:
    """Turn cold spare replicas into replicas of the hottest expert, in place.

    Repeats while the heaviest per-replica load exceeds ``limit``: the donor is
    the expert that stays lightest after losing a replica, and the slot taken
    is the donor's replica on the least-loaded rank that lacks the hot expert.
    ``cnt`` is updated.  Returns the number of slots changed.
    """
    d_count, s_count = slots.shape
    e_count = load.shape[0]
    holds = holds_table(slots, e_count)
    moves = 0
    while moves < max_moves:
        a = -1
        wa = -1.0
        for e in range(e_count):
            if cnt[e] < d_count and load[e] / cnt[e] > wa:
                wa = load[e] / cnt[e]
                a = e
        if a < 0 or wa <= limit:
            break
        loads = rank_loads(slots, load / cnt)
        best_v = wa
        best_r = -1
        best_s = -1
        for r in range(d_count):
            if holds[r, a]:
                continue
            for s in range(s_count):
                d = slots[r, s]
                if cnt[d] < 2:
                    continue
                v = load[d] / (cnt[d] - 1)
                # prefer the lightest donor, then the lightest rank
                if v < best_v or (v == best_v and best_r >= 0 and loads[r] < loads[best_r]):
                    best_v = v
                    best_r = r
                    best_s = s
        if best_r < 0:
            break
        d = slots[best_r, best_s]
        slots[best_r, best_s] = a
        holds[best_r, d] = False
        holds[best_r, a] = True
        cnt[d] -= 1
        cnt[a] += 1
        moves += 1
    return moves


def repair_layer(old: np.ndarray, load: np.ndarray, rep_limit: float,
                 stop_at: float, max_moves: int, pair_cap: int) -> tuple[np.ndarray, int]:
    """Retarget replicas above ``rep_limit``, then swap until max load ``<= stop_at``.

    ``old`` is ``[D, S]``; returns the new table and the moves it costs
    (retargets count 1, swaps 2; the total stays within ``max_moves``).
    """
    slots = np.array(old, dtype=np.int64, copy=True)
    cnt = np.bincount(slots.ravel(), minlength=load.shape[0]).astype(np.int64)
    moves = retarget_replicas(slots, load, cnt, rep_limit, max_moves)
    swaps = swap_descent(slots, load / cnt, (max_moves - moves) // 2, stop_at, pair_cap)
    return slots, moves + 2 * swaps
