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

from vllm_npu.eplb._jit import njit
from vllm_npu.eplb.packing import holds_table


@njit
def _place_kept(new: np.ndarray, old: np.ndarray, target: np.ndarray,
                num_experts: int) -> np.ndarray:
    """Write new rank ``i`` onto physical rank ``target[i]``, keeping old positions."""
    d_count, s_count = new.shape
    out = -np.ones_like(new)
    mark = np.zeros(num_experts, np.bool_)
    for i in range(d_count):
        j = target[i]
        for s in range(s_count):
            mark[new[i, s]] = True
        for s in range(s_count):
            if mark[old[j, s]]:
                out[j, s] = old[j, s]
                mark[old[j, s]] = False
        pos = 0
        for s in range(s_count):
            e = new[i, s]
            if mark[e]:
                while out[j, pos] >= 0:
                    pos += 1
                out[j, pos] = e
                mark[e] = False
    return out


def align_layer(new: np.ndarray, old: np.ndarray, num_experts: int) -> np.ndarray:
    """``new`` re-laid onto physical ranks/slots to minimise moves against ``old`` (both ``[D, S]``)."""
    overlap = holds_table(new, num_experts).astype(np.float64) @ \
        holds_table(old, num_experts).astype(np.float64).T
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    target = np.empty(new.shape[0], np.int64)
    target[rows] = cols
    return _place_kept(np.ascontiguousarray(new), np.ascontiguousarray(old), target, num_experts)
