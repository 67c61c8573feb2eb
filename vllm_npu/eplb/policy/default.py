"""``default``: DeepSeek-style greedy replication + heaviest-first packing.

1. Each redundant slot replicates the expert with the heaviest per-replica load.
2. Replicas, heaviest first, go to the least-loaded rank that has a free slot
   and does not hold that expert yet (DeepSeek's packing can put two replicas
   of one expert on one rank; this one cannot).

No alignment to the old placement: this is the baseline.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.layer_solve import full_solve
from vllm_npu.eplb.policy import Policy
from vllm_npu.eplb.policy.validate import Problem


class DefaultPolicy(Policy):
    name = "default"

    def solve(self, problem: Problem) -> np.ndarray:
        d, s = problem.num_ranks, problem.slots_per_rank
        out = np.empty((problem.num_layers, d * s), np.int64)
        for layer in range(problem.num_layers):
            out[layer] = full_solve(problem.load[layer], d, s, max_swaps=0).ravel()
        return out
