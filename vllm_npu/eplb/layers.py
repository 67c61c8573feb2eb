"""Per-layer helpers the policies share: table reshapes, full solve, risk load."""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.packing import packed_layer, water_fill

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


def layer_peak(load: np.ndarray, slots: np.ndarray) -> float:
    """Max rank load of one ``[D, S]`` table under ``load`` ``[E]``."""
    cnt = np.bincount(slots.ravel(), minlength=load.shape[0])
    return float((load / np.maximum(cnt, 1))[slots].sum(axis=1).max())
