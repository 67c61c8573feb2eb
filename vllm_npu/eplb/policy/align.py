"""Hungarian alignment of a new plan to the old placement.

Ranks are interchangeable, so a new plan's rank ``i`` may land on any physical
rank ``j``.  We pick the one-to-one map maximising kept experts (scipy
``linear_sum_assignment`` on the ``D x D`` overlap), then keep every retained
expert in its old slot so only genuinely new experts move::

    old  rank j: [ 7  3  9 ]        new rank i: {3, 9, 5}
    out  rank j: [ 5  3  9 ]        -> 1 move (slot 0), not 3
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from vllm_npu.eplb.policy.packing import holds_table


def _place_kept(new: np.ndarray, old: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Write new rank ``i`` onto physical rank ``target[i]``, keeping old positions.

    numpy, not numba: the ``[D, S, S]`` comparison is cheap, while a kernel
    here added ~1 s of cold JIT.  Relies on no rank holding an expert twice.
    """
    placed = np.empty_like(new)
    placed[target] = new
    same = old[:, :, None] == placed[:, None, :]  # [j, s, t]: old slot s == new expert t
    keep = same.any(axis=2)
    out = np.where(keep, old, -1)
    # arriving experts, in new-slot order, fill each rank's freed slots in order
    out[~keep] = placed[~same.any(axis=1)]
    return out


def align_layer(new: np.ndarray, old: np.ndarray, num_experts: int) -> np.ndarray:
    """``new`` re-laid onto physical ranks/slots to minimise moves against ``old``.

    Both are ``[D, S]`` tables.
    """
    overlap = holds_table(new, num_experts).astype(np.float64) @ \
        holds_table(old, num_experts).astype(np.float64).T
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    target = np.empty(new.shape[0], np.int64)
    target[rows] = cols
    return _place_kept(new, old, target)
