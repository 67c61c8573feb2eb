"""Balance metrics: rank load, lower bound, imbalance, moves.

Token load of a rank = sum over its slots of ``load[e] / replicas(e)``: a
replicated expert's traffic splits evenly over its replicas.  Imbalance is
``max rank load / LB`` with::

    LB = max(total / D, min over replica counts of max_e load[e] / cnt[e])

the second term being the best max per-replica load the slot count allows
(every rank holding the hottest replica carries at least that much).
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.packing import water_fill


def replica_counts(phy2log: np.ndarray, num_experts: int) -> np.ndarray:
    """``[L, E]`` number of slots holding each expert."""
    p = np.asarray(phy2log, dtype=np.int64)
    offs = np.arange(p.shape[0])[:, None] * num_experts
    return np.bincount((p + offs).ravel(), minlength=p.shape[0] * num_experts).reshape(
        p.shape[0], num_experts)


def rank_loads(load: np.ndarray, phy2log: np.ndarray, num_ranks: int) -> np.ndarray:
    """``[L, D]`` token load of every rank; ``load`` is ``[L, E]``."""
    load = np.asarray(load, dtype=np.float64)
    p = np.asarray(phy2log, dtype=np.int64)
    cnt = replica_counts(p, load.shape[1])
    per_replica = load / np.maximum(cnt, 1)
    slot_load = np.take_along_axis(per_replica, p, axis=1)
    return slot_load.reshape(p.shape[0], num_ranks, -1).sum(axis=2)


def lower_bound(load: np.ndarray, num_ranks: int, slots_per_rank: int) -> np.ndarray:
    """``[L]`` lower bound on the max rank load of any valid placement."""
    load = np.asarray(load, dtype=np.float64)
    n = num_ranks * slots_per_rank
    out = np.empty(load.shape[0])
    for layer in range(load.shape[0]):
        row = np.ascontiguousarray(load[layer])
        cnt = water_fill(row, n, num_ranks)
        out[layer] = max(row.sum() / num_ranks, float((row / cnt).max()))
    return out


def imbalance(load: np.ndarray, phy2log: np.ndarray, num_ranks: int,
              slots_per_rank: int) -> np.ndarray:
    """``[L]`` max rank load / LB (1.0 is optimal; an all-zero layer counts as 1.0)."""
    peak = rank_loads(load, phy2log, num_ranks).max(axis=1)
    lb = lower_bound(load, num_ranks, slots_per_rank)
    safe = np.where(lb > 0, lb, 1.0)
    return np.where(lb > 0, peak / safe, 1.0)


def moved_slots(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``[L]`` slots whose expert changed, i.e. weights a rank must receive."""
    return (np.asarray(old) != np.asarray(new)).sum(axis=-1)
