"""Per-layer helpers the policies share: table reshapes, full solve, risk load."""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.packing import packed_layer, water_fill

# Swap descent rarely needs more than a few hundred swaps; the cap only
# guards the worst case.
MAX_SWAPS = 4096


def as_tables(phy2log: np.ndarray, num_ranks: int, slots_per_rank: int) -> np.ndarray:
    """``[L, D*S]`` -> ``[L, D, S]`` (a view when possible)."""
    return np.asarray(phy2log, dtype=np.int64).reshape(-1, num_ranks, slots_per_rank)


def best_replica_load(load: np.ndarray, num_ranks: int, slots_per_rank: int) -> float:
    """Smallest achievable max per-replica load for one layer (``load`` is ``[E]``)."""
    cnt = water_fill(load, num_ranks * slots_per_rank, num_ranks)
    return float((load / cnt).max())


def layer_lower_bound(load: np.ndarray, num_ranks: int, slots_per_rank: int) -> float:
    """``max(total / D, best max per-replica load)`` for one layer."""
    return max(float(load.sum()) / num_ranks, best_replica_load(load, num_ranks, slots_per_rank))


def full_solve(load: np.ndarray, num_ranks: int, slots_per_rank: int,
               max_swaps: int = MAX_SWAPS) -> np.ndarray:
    """Water-fill replica counts, LPT pack, swap descent: ``[D, S]`` for one layer."""
    load = np.ascontiguousarray(load, dtype=np.float64)
    cnt = water_fill(load, num_ranks * slots_per_rank, num_ranks)
    return packed_layer(load, cnt, num_ranks, slots_per_rank, max_swaps)


def risk_load(windows: np.ndarray, z: float) -> np.ndarray:
    """``[L, E]`` load scaled to the window total: ``T * (mean + z * std)`` over sub-windows.

    A hot-but-steady expert and a bursty one with the same mean differ only
    in the ``z * std`` term, so bursty experts get replicas first.
    """
    t = windows.shape[0]
    mean = windows.mean(axis=0)
    if t == 1 or z == 0.0:
        return mean * t
    return (mean + z * windows.std(axis=0)) * t


def shift_replica(cnt: np.ndarray, load: np.ndarray, into: np.ndarray,
                  cap: int) -> np.ndarray | None:
    """Move one replica to the hottest-per-replica expert in ``into`` (a boolean mask)
    from the cheapest donor outside it; None if impossible. ``cap``: most replicas."""
    per = np.where((cnt < cap) & into, load / cnt, -1.0)
    a = int(per.argmax())
    if per[a] < 0:
        return None
    cost = np.where((cnt >= 2) & ~into, load / np.maximum(cnt - 1, 1), np.inf)
    d = int(cost.argmin())
    if not np.isfinite(cost[d]):
        return None
    out = cnt.copy()
    out[a] += 1
    out[d] -= 1
    return out


def count_search(load: np.ndarray, cnt: np.ndarray, num_ranks: int, slots_per_rank: int,
                 top: int = 8, max_rounds: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Hill-climb replica counts by their packed peak: each round tries giving one of the
    ``top`` hottest experts a replica (from the cheapest donor) or taking one away (to the
    heaviest-per-replica expert), packs each (LPT + swap descent) and takes the first that
    lowers the peak.

    Returns ``(counts, table)``. Water-filled counts minimise the largest *replica*, not
    the largest *rank*: with heavy heads they can leave more big replicas than ranks.
    """
    best_cnt = cnt
    best = packed_layer(load, cnt, num_ranks, slots_per_rank, MAX_SWAPS)
    best_peak = layer_peak(load, best)
    hottest = np.argsort(-load, kind="stable")[:top]
    for _ in range(max_rounds):
        improved = False
        for a in hottest:
            one = np.zeros(load.shape[0], bool)
            one[a] = True
            for cand in (shift_replica(best_cnt, load, one, num_ranks),
                         shift_replica(best_cnt, load, ~one, num_ranks)):
                if cand is None:
                    continue
                table = packed_layer(load, cand, num_ranks, slots_per_rank, MAX_SWAPS)
                peak = layer_peak(load, table)
                if peak < best_peak * (1.0 - 1e-9):
                    best_cnt, best, best_peak, improved = cand, table, peak, True
                    break
            if improved:
                break  # first improvement: restart from the hottest expert
        if not improved:
            break
    return best_cnt, best


def layer_peak(load: np.ndarray, slots: np.ndarray) -> float:
    """Max rank load of one ``[D, S]`` table under ``load`` ``[E]``."""
    cnt = np.bincount(slots.ravel(), minlength=load.shape[0])
    return float((load / np.maximum(cnt, 1))[slots].sum(axis=1).max())
