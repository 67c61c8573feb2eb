"""``swift`` (SwiftBalance): repair the old placement instead of replacing it.

Non-redundant experts stay where they are.  Only what must move is
re-chosen: a spare replica is retargeted to a hot expert when the hottest
per-replica load exceeds the best achievable by more than ``rep_tol``.  Then
improving swaps off the hottest rank, at most ``pair_cap`` per rank pair so no
link carries a burst of transfers::

    rank h (hot) [ A  b  c ]   swap A<->x   rank h [ x  b  c ]
    rank y       [ x  y  z ]   ---------->  rank y [ A  y  z ]

Without an old placement it falls back to a full solve.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.incremental import repair_layer
from vllm_npu.eplb.policy.layer_solve import as_tables, best_replica_load, full_solve
from vllm_npu.eplb.policy import Policy
from vllm_npu.eplb.policy.validate import Problem


class SwiftPolicy(Policy):
    name = "swift"

    def __init__(self, rep_tol: float = 0.02, tol: float = 0.002, pair_cap: int = 1) -> None:
        self.rep_tol = rep_tol    # slack on the hottest replica before retargeting
        self.tol = tol            # stop swapping within this of the lower bound
        self.pair_cap = pair_cap  # swaps allowed per rank pair per rebalance

    def solve(self, problem: Problem) -> np.ndarray:
        d, s = problem.num_ranks, problem.slots_per_rank
        out = np.empty((problem.num_layers, d * s), np.int64)
        old = None if problem.old is None else as_tables(problem.old, d, s)
        for layer in range(problem.num_layers):
            load = np.ascontiguousarray(problem.load[layer])
            if old is None:
                out[layer] = full_solve(load, d, s).ravel()
                continue
            rep_best = best_replica_load(load, d, s)
            lb = max(float(load.sum()) / d, rep_best)
            stop_at = lb * (1.0 + self.tol)
            # swaps cannot push the max below the hottest replica, so cap the slack
            rep_limit = min(rep_best * (1.0 + self.rep_tol), stop_at)
            table, _ = repair_layer(old[layer], load, rep_limit, stop_at, d * s, self.pair_cap)
            out[layer] = table.ravel()
        return out
