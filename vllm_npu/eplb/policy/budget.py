"""``budget``: balance under an explicit move budget, with hysteresis.

Per layer, with an old placement:

* old max load within ``keep_tol`` of LB -> keep it (0 moves);
* else repair it (retarget hot replicas, then swaps) down to ``stop_tol``,
  never spending more than ``move_budget`` of the layer's slots;
* if the repair stalls above ``keep_tol``, also try a full solve aligned to
  the old placement (Hungarian) and take it when it fits the budget and is
  better balanced.

Repairing below the keep threshold (``stop_tol < keep_tol``) leaves headroom,
so a slowly drifting layer is not touched again at the next window::

    LB        stop      keep               (max rank load / LB)
    1.000 --- 1.004 --- 1.010 ----------->
              ^repair to here   ^repair only above here
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.align import align_layer
from vllm_npu.eplb.policy.incremental import repair_layer
from vllm_npu.eplb.policy.layer_solve import as_tables, best_replica_load, full_solve, layer_peak
from vllm_npu.eplb.policy.metrics import moved_slots
from vllm_npu.eplb.policy import Policy
from vllm_npu.eplb.policy.validate import Problem


class BudgetPolicy(Policy):
    name = "budget"

    def __init__(self, keep_tol: float = 0.01, stop_tol: float = 0.004,
                 move_budget: float = 0.15, rep_tol: float = 0.05) -> None:
        self.keep_tol = keep_tol        # leave a layer alone below this imbalance
        self.stop_tol = stop_tol        # repair down to this imbalance
        self.move_budget = move_budget  # max fraction of a layer's slots to change
        self.rep_tol = rep_tol          # slack on the hottest replica before retargeting

    def solve(self, problem: Problem) -> np.ndarray:
        d, s = problem.num_ranks, problem.slots_per_rank
        out = np.empty((problem.num_layers, d * s), np.int64)
        old = None if problem.old is None else as_tables(problem.old, d, s)
        budget = max(2, int(self.move_budget * d * s))
        for layer in range(problem.num_layers):
            load = np.ascontiguousarray(problem.load[layer])
            if old is None:
                out[layer] = full_solve(load, d, s).ravel()
                continue
            rep_best = best_replica_load(load, d, s)
            lb = max(float(load.sum()) / d, rep_best)
            keep_at = lb * (1.0 + self.keep_tol)
            if layer_peak(load, old[layer]) <= keep_at:
                out[layer] = old[layer].ravel()
                continue
            stop_at = lb * (1.0 + self.stop_tol)
            rep_limit = min(rep_best * (1.0 + self.rep_tol), stop_at)
            table, _ = repair_layer(old[layer], load, rep_limit, stop_at, budget, 0)
            peak = layer_peak(load, table)
            if peak > keep_at:
                fresh = align_layer(full_solve(load, d, s), old[layer], load.shape[0])
                fresh_peak = layer_peak(load, fresh)
                if fresh_peak < peak and moved_slots(old[layer], fresh).sum() <= budget:
                    table = fresh
            out[layer] = table.ravel()
        return out
