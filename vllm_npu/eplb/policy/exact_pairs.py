"""Exact placement when every rank holds two slots (``S = 2``), by enumerating replica counts.

With ``S = 2`` a plan is a pairing of the ``2D`` replicas. For fixed replica counts, pairing
the heaviest replica with the lightest, the second heaviest with the second lightest, and
so on minimises the largest pair sum (the classic exchange argument). That pairing ignores
the rule that a rank may not hold one expert twice; when it happens to obey it, it is
optimal for those counts, otherwise its peak is still a lower bound for them. So::

    for every count vector k (1 <= k_e <= D, sum k = 2D):
        pair the sorted replicas -> peak(k); certified if no pair repeats an expert
    optimal = the best certified peak, provided no uncertified vector has a lower peak

This proves the DeepSeek EPLB README example (12 experts, 8 ranks x 2 slots; 1,365 count
vectors) optimal in milliseconds, where the MILP of :mod:`vllm_npu.eplb.policy.exact` needs ~6 s.
"""
from __future__ import annotations

from math import comb

import numpy as np

MAX_COUNT_VECTORS = 50_000


def count_vectors(num_experts: int, num_ranks: int, extra: int):
    """Every ``k`` with ``1 <= k_e <= num_ranks`` and ``sum(k) = num_experts + extra``."""
    k = np.ones(num_experts, np.int64)

    def fill(e: int, left: int):
        if e == num_experts - 1:
            if left <= num_ranks - 1:
                k[e] = 1 + left
                yield k.copy()
            return
        for add in range(min(left, num_ranks - 1) + 1):
            k[e] = 1 + add
            yield from fill(e + 1, left - add)
        k[e] = 1

    yield from fill(0, extra)


def solve_two_slots(load: np.ndarray, num_ranks: int) -> np.ndarray | None:
    """The optimal ``[D, 2]`` table for one layer's ``load`` ``[E]``, or None when the
    enumeration is too large or cannot certify its best pairing."""
    load = np.asarray(load, dtype=np.float64)
    e_count, d = load.shape[0], num_ranks
    extra = 2 * d - e_count
    if extra < 0 or e_count < 2 or comb(e_count - 1 + extra, extra) > MAX_COUNT_VECTORS:
        return None
    best, best_pairs, floor = np.inf, None, np.inf  # floor: best uncertified peak
    for k in count_vectors(e_count, d, extra):
        experts = np.repeat(np.arange(e_count), k)
        weight = (load / k)[experts]
        order = np.argsort(-weight, kind="stable")
        first, second = order[:d], order[::-1][:d]
        peak = float((weight[first] + weight[second]).max())
        if peak >= best:
            continue
        if (experts[first] == experts[second]).any():
            floor = min(floor, peak)
        else:
            best, best_pairs = peak, np.stack([experts[first], experts[second]], axis=1)
    if best_pairs is None or floor < best:
        return None
    return best_pairs
