"""``flashlb`` (FlashLB + FlashTree): risk-aware counts, tree search, aligned to the old plan.

Per layer:

1. Keep the old placement if it is still within ``keep_tol`` of the lower
   bound on the new window (zero moves for layers that did not degrade).
2. Risk load ``mean + z * std`` over the sub-windows: bursty experts count heavier.
3. FlashTree: start from water-filled replica counts; children shift one
   replica into / out of a hotness group of experts::

       groups (hot -> cold):  [g0 | g1 | g2]
       child "+g1": hottest replica in g1 gains a slot, the cheapest donor elsewhere loses one
       child "-g1": cheapest donor in g1 loses a slot, the hottest replica elsewhere gains it

   Every node is LPT-packed + swap-descended (numba) and scored on the
   aggregate window and on each sub-window; the best child is expanded
   ``depth`` times while it improves.
4. Hungarian alignment to the old placement (scipy) so kept experts stay put.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.align import align_layer
from vllm_npu.eplb.policy.layer_solve import (
    MAX_SWAPS,
    as_tables,
    layer_lower_bound,
    layer_peak,
    risk_load,
    shift_replica,
)
from vllm_npu.eplb.policy.packing import packed_layer, water_fill
from vllm_npu.eplb.policy import Policy
from vllm_npu.eplb.policy.validate import Problem


class FlashLBPolicy(Policy):
    name = "flashlb"

    def __init__(self, z: float = 0.0, keep_tol: float = 0.004, groups: int = 2,
                 depth: int = 2, search_tol: float = 0.005, sub_weight: float = 0.25) -> None:
        self.z = z                    # std weight in the risk load
        self.keep_tol = keep_tol      # old layer kept if within this of LB
        self.groups = groups          # hotness groups in the tree
        self.depth = depth            # tree levels expanded
        self.search_tol = search_tol  # skip the tree when the root is this close to LB
        self.sub_weight = sub_weight  # weight of the sub-window score

    def solve(self, problem: Problem) -> np.ndarray:
        d, s = problem.num_ranks, problem.slots_per_rank
        risk = risk_load(problem.windows, self.z)
        old = None if problem.old is None else as_tables(problem.old, d, s)
        out = np.empty((problem.num_layers, d * s), np.int64)
        for layer in range(problem.num_layers):
            agg = np.ascontiguousarray(problem.load[layer])
            lb = layer_lower_bound(agg, d, s)
            if old is not None and layer_peak(agg, old[layer]) <= lb * (1.0 + self.keep_tol):
                out[layer] = old[layer].ravel()
                continue
            subs = problem.windows[:, layer] if problem.windows.shape[0] > 1 else None
            table = self._tree(np.ascontiguousarray(risk[layer]), agg, lb, subs, d, s)
            if old is not None:
                table = align_layer(table, old[layer], agg.shape[0])
            out[layer] = table.ravel()
        return out

    def _score(self, table: np.ndarray, agg: np.ndarray, lb: float,
               subs: np.ndarray | None, sub_lb: np.ndarray | None) -> float:
        score = layer_peak(agg, table) / lb
        if subs is not None and sub_lb is not None:
            sub = [layer_peak(w, table) / b for w, b in zip(subs, sub_lb)]
            score += self.sub_weight * float(np.mean(sub))
        return score

    def _tree(self, risk: np.ndarray, agg: np.ndarray, lb: float,
              subs: np.ndarray | None, d: int, s: int) -> np.ndarray:
        cnt = water_fill(risk, d * s, d)
        best = packed_layer(risk, cnt, d, s, MAX_SWAPS)
        if lb <= 0 or layer_peak(agg, best) <= lb * (1.0 + self.search_tol):
            return best
        sub_lb = None
        if subs is not None and self.sub_weight > 0:
            # sub-window bounds do not depend on the candidate: compute once
            sub_lb = np.array([max(layer_lower_bound(w, d, s), 1e-12) for w in subs])
        best_score = self._score(best, agg, lb, subs, sub_lb)
        order = np.argsort(-risk, kind="stable")
        group_of = np.empty(risk.shape[0], np.int64)
        group_of[order] = np.arange(risk.shape[0]) * self.groups // risk.shape[0]
        for _ in range(self.depth):
            improved = False
            base = cnt
            for g in range(self.groups):
                mask = group_of == g
                for child in (shift_replica(base, risk, mask, d),
                              shift_replica(base, risk, ~mask, d)):
                    if child is None:
                        continue
                    table = packed_layer(risk, child, d, s, MAX_SWAPS)
                    score = self._score(table, agg, lb, subs, sub_lb)
                    if score < best_score - 1e-9:
                        best, best_score, cnt, improved = table, score, child, True
            if not improved:
                break
        return best
