"""Exact placement of one small layer, as a mixed-integer program (scipy's HiGHS).

The model the policies and metrics use: expert ``e`` gets ``k_e`` replicas on ``k_e``
distinct ranks, every rank holds exactly ``S`` slots, a replica carries ``load[e] / k_e``,
and the objective is the largest rank load. The ``1 / k_e`` makes the rank load
nonlinear in the replica counts, so the program picks the count and the ranks together:

    z[e, k, d]  binary   expert e has k replicas, one of them on rank d
    y[e, k]     binary   expert e has k replicas
    t           the largest rank load (minimised)

    sum_k y[e, k] = 1                             one replica count per expert
    sum_d z[e, k, d] - k * y[e, k] = 0            k replicas, on k distinct ranks
    sum_{e,k} z[e, k, d] = S                      every rank's slots filled
    sum_{e,k} (load[e] / k) z[e, k, d] - t <= 0   rank load bounded by t
    sum_k z[hottest, k, 0] = 1                    symmetry: rank 0 holds the hottest expert
    t >= metrics.lower_bound                      lets the search stop at the bound

``E * K * D`` binaries with ``K = min(D, D*S - E + 1)``. Two-slot ranks go first to the exact
count enumeration of :mod:`vllm_npu.eplb.policy.exact_pairs` (the DeepSeek EPLB README
example, 12 experts on 8 ranks x 2 slots, in ~30 ms; this program needs ~6 s to prove its
layer 0). Above ``MAX_BINARIES`` the policies keep their heuristics.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from vllm_npu.eplb.policy.exact_pairs import solve_two_slots
from vllm_npu.eplb.policy.metrics import lower_bound

MAX_BINARIES = 4000   # problems above this size are left to the heuristics
TIME_LIMIT_S = 2.0    # per layer; a timed-out solve is not used


def replica_choices(num_experts: int, num_ranks: int, slots_per_rank: int) -> int:
    """K: the most replicas one expert can have (one per rank, and every expert >= 1)."""
    return min(num_ranks, num_ranks * slots_per_rank - num_experts + 1)


def is_small(num_experts: int, num_ranks: int, slots_per_rank: int) -> bool:
    k = replica_choices(num_experts, num_ranks, slots_per_rank)
    return k >= 1 and num_experts * k * num_ranks <= MAX_BINARIES


def solve_layer(load: np.ndarray, num_ranks: int, slots_per_rank: int,
                time_limit_s: float = TIME_LIMIT_S,
                incumbent_ok: bool = False) -> np.ndarray | None:
    """The optimal ``[D, S]`` table of expert ids for one layer's ``load`` ``[E]``, or
    None when the program is too large, infeasible or not solved to optimality in time.
    ``incumbent_ok``: on a time-out, return the best table found so far instead (not
    proven optimal; a caller compares it with its own plan)."""
    load = np.asarray(load, dtype=np.float64)
    if slots_per_rank == 2:
        table = solve_two_slots(load, num_ranks)   # exact and fast when it applies
        if table is not None:
            return table
    e_count, d_count, s_count = load.shape[0], num_ranks, slots_per_rank
    k_count = replica_choices(e_count, d_count, s_count)
    if k_count < 1 or not is_small(e_count, d_count, s_count):
        return None
    n_z = e_count * k_count * d_count
    n_y = e_count * k_count
    n_var = n_z + n_y + 1                       # [z | y | t]

    def z(e, k, d):                             # k is 0-based: k + 1 replicas
        return (e * k_count + k) * d_count + d

    def y(e, k):
        return n_z + e * k_count + k

    rows, cols, vals, lo, hi = [], [], [], [], []

    def add_row(entries, lower, upper):
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    for e in range(e_count):
        add_row([(y(e, k), 1.0) for k in range(k_count)], 1.0, 1.0)
        for k in range(k_count):
            add_row([(z(e, k, d), 1.0) for d in range(d_count)] + [(y(e, k), -(k + 1.0))],
                    0.0, 0.0)
    def rank_load(d, sign=1.0):
        return [(z(e, k, d), sign * load[e] / (k + 1)) for e in range(e_count)
                for k in range(k_count)]

    for d in range(d_count):
        add_row([(z(e, k, d), 1.0) for e in range(e_count) for k in range(k_count)],
                float(s_count), float(s_count))
        add_row(rank_load(d) + [(n_var - 1, -1.0)], -np.inf, 0.0)
    # Ranks are interchangeable: the hottest expert has a replica on rank 0.
    hottest = int(np.argmax(load))
    add_row([(z(hottest, k, 0), 1.0) for k in range(k_count)], 1.0, 1.0)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(lo), n_var)).tocsr()
    cost = np.zeros(n_var)
    cost[-1] = 1.0
    integrality = np.ones(n_var)
    integrality[-1] = 0
    upper = np.ones(n_var)
    upper[-1] = np.inf
    lower = np.zeros(n_var)
    lower[-1] = lower_bound(load[None], d_count, s_count)[0]
    result = milp(cost, constraints=LinearConstraint(matrix, lo, hi),
                  integrality=integrality, bounds=Bounds(lower, upper),
                  options={"time_limit": time_limit_s})
    # 0: optimal; 1: time limit (x is the incumbent, if any); 2: infeasible
    if result.x is None or result.status not in ((0, 1) if incumbent_ok else (0,)):
        return None
    chosen = np.rint(result.x[:n_z]).reshape(e_count, k_count, d_count) > 0.5
    table = np.empty((d_count, s_count), np.int64)
    for d in range(d_count):
        experts = np.nonzero(chosen[:, :, d].any(axis=1))[0]
        if experts.size != s_count:
            return None  # a rounding artefact: never seen, but never trusted either
        table[d] = experts
    return table
