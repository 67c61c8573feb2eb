"""numba kernels shared by the policies: replica counts, packing, swap search.

One layer is handled at a time as a ``[D, S]`` table of expert ids::

            slot 0  slot 1  ...  slot S-1
    rank 0 [  e      e            e   ]   load(rank) = sum load[e] / cnt[e]
    rank 1 [  e      e            e   ]
    ...

Cold JIT (first call without a numba cache) is kept short by two rules:

* big kernels are called from Python, not from other kernels: numba
  re-optimises a jitted callee inside every jitted caller;
* every numpy function a kernel calls is compiled on its own (~0.2 s) for
  each new set of argument types, so kernels allocate only with ``np.zeros``
  and loop instead of calling ``np.ones``, ``np.argmax`` or ``np.argsort``.
"""

from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy._jit import njit

_EPS = 1e-12


@njit
def water_fill(load: np.ndarray, num_slots: int, max_rep: int) -> np.ndarray:
    """Replica counts minimising the max per-replica load ``load[e] / cnt[e]``.

    Greedy: every extra slot goes to the expert whose replicas are currently
    the heaviest (and that is on fewer than ``max_rep`` ranks).  This greedy is
    optimal for the min-max, so it also gives the lower bound.
    """
    e_count = load.shape[0]
    cnt = np.zeros(e_count, np.int64)  # not np.ones: see the module docstring
    cnt[:] = 1
    for _ in range(num_slots - e_count):
        best = -1
        best_v = -1.0
        for e in range(e_count):
            if cnt[e] < max_rep:
                v = load[e] / cnt[e]
                if v > best_v:
                    best_v = v
                    best = e
        cnt[best] += 1
    return cnt


@njit
def rank_loads(slots: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Load of every rank given the per-replica ``weight`` of each expert."""
    d_count, s_count = slots.shape
    out = np.zeros(d_count)
    for d in range(d_count):
        acc = 0.0
        for s in range(s_count):
            acc += weight[slots[d, s]]
        out[d] = acc
    return out


@njit
def holds_table(slots: np.ndarray, num_experts: int) -> np.ndarray:
    """``holds[d, e]``: rank ``d`` already has expert ``e`` (no duplicates allowed)."""
    d_count, s_count = slots.shape
    holds = np.zeros((d_count, num_experts), np.bool_)
    for d in range(d_count):
        for s in range(s_count):
            if slots[d, s] >= 0:
                holds[d, slots[d, s]] = True
    return holds


@njit
def _place_stuck(e: int, w: float, slots: np.ndarray, fill: np.ndarray,
                 loads: np.ndarray, holds: np.ndarray, weight: np.ndarray) -> None:
    """Place expert ``e`` when every rank with room already holds it.

    Since ``cnt[e] <= D`` some full rank ``z`` lacks ``e``; move one of ``z``'s
    experts that the roomy rank ``y`` lacks over to ``y`` and put ``e`` in
    ``z``.  Such an expert exists: ``y`` holds ``e``, ``z`` does not.
    """
    d_count, s_count = slots.shape
    y = -1
    for d in range(d_count):
        if fill[d] < s_count and (y < 0 or loads[d] < loads[y]):
            y = d
    for z in range(d_count):
        if holds[z, e]:
            continue
        for s in range(s_count):
            f = slots[z, s]
            if not holds[y, f]:
                slots[y, fill[y]] = f
                fill[y] += 1
                holds[y, f] = True
                loads[y] += weight[f]
                holds[z, f] = False
                slots[z, s] = e
                holds[z, e] = True
                loads[z] += w - weight[f]
                return


@njit
def lpt_pack(weight: np.ndarray, cnt: np.ndarray, order: np.ndarray, num_ranks: int,
             slots_per_rank: int) -> np.ndarray:
    """Heaviest replica first onto the least-loaded rank with room that lacks it.

    ``weight[e]`` is the per-replica load of expert ``e`` (``load / cnt``) and
    ``order`` the experts by decreasing weight, ties by id; the ``cnt[e]``
    replicas of an expert are placed one after another.  Returns the ``[D, S]``
    slot table.
    """
    e_count = weight.shape[0]
    slots = np.zeros((num_ranks, slots_per_rank), np.int64)
    slots[:] = -1
    fill = np.zeros(num_ranks, np.int64)
    loads = np.zeros(num_ranks)
    holds = np.zeros((num_ranks, e_count), np.bool_)
    for e in order:
        for _ in range(cnt[e]):
            best = -1
            for d in range(num_ranks):
                if fill[d] < slots_per_rank and not holds[d, e]:
                    if best < 0 or loads[d] < loads[best]:
                        best = d
            if best < 0:
                _place_stuck(e, weight[e], slots, fill, loads, holds, weight)
                continue
            slots[best, fill[best]] = e
            fill[best] += 1
            holds[best, e] = True
            loads[best] += weight[e]
    return slots


@njit
def swap_slots(slots: np.ndarray, holds: np.ndarray, h: int, i: int, y: int,
               j: int) -> tuple[int, int]:
    """Exchange slot ``i`` of rank ``h`` with slot ``j`` of rank ``y``, keeping ``holds``
    in step; returns the experts ``(a, b)`` that left ``h`` and ``y``."""
    a = slots[h, i]
    b = slots[y, j]
    slots[h, i] = b
    slots[y, j] = a
    holds[h, a] = False
    holds[h, b] = True
    holds[y, b] = False
    holds[y, a] = True
    return a, b


@njit
def swap_descent(slots: np.ndarray, weight: np.ndarray, max_swaps: int,
                 stop_at: float, pair_cap: int) -> int:
    """Improve ``slots`` in place by swapping experts off the hottest rank.

    Each step takes the hottest rank ``h`` and the single swap (one slot of
    ``h`` against one slot of another rank ``y``) that most lowers
    ``max(load[h], load[y])``, keeping the no-duplicate rule.  Stops when no
    swap helps, after ``max_swaps`` swaps, or once the max load is
    ``<= stop_at``.  ``pair_cap > 0`` bounds swaps per rank pair (transfer
    budget per link).  Returns the number of swaps made.
    """
    d_count, s_count = slots.shape
    e_count = weight.shape[0]
    loads = rank_loads(slots, weight)
    holds = holds_table(slots, e_count)
    pair_used = np.zeros((d_count, d_count), np.int64)
    done = 0
    while done < max_swaps:
        h = 0  # first hottest rank, as np.argmax
        for d in range(1, d_count):
            if loads[d] > loads[h]:
                h = d
        top = loads[h]
        if top <= stop_at:
            break
        best = top - _EPS * (1.0 + top)
        bi = -1
        by = -1
        bj = -1
        for i in range(s_count):
            a = slots[h, i]
            wa = weight[a]
            for y in range(d_count):
                if y == h or holds[y, a]:
                    continue
                if pair_cap > 0 and pair_used[h, y] >= pair_cap:
                    continue
                ly = loads[y]
                for j in range(s_count):
                    b = slots[y, j]
                    delta = wa - weight[b]
                    if delta <= 0.0:
                        continue
                    m = max(ly + delta, top - delta)
                    if m < best and not holds[h, b]:
                        best = m
                        bi = i
                        by = y
                        bj = j
        if bi < 0:
            break
        a, b = swap_slots(slots, holds, h, bi, by, bj)
        delta = weight[a] - weight[b]
        loads[h] -= delta
        loads[by] += delta
        pair_used[h, by] += 1
        pair_used[by, h] += 1
        done += 1
    return done


def packed_layer(load: np.ndarray, cnt: np.ndarray, num_ranks: int, slots_per_rank: int,
                 max_swaps: int) -> np.ndarray:
    """LPT pack for given replica counts, then swap descent (``max_swaps`` 0 skips it).

    Plain Python, not a kernel: see the module docstring (numba's stable argsort
    alone cost ~2 s of cold JIT).  From Python, ``0`` / ``0.0`` are typed int64 /
    float64 like any other value, so no second specialisation of ``swap_descent``.
    """
    weight = load / cnt
    order = np.argsort(-weight, kind="stable")  # ties by expert id
    slots = lpt_pack(weight, cnt, order, num_ranks, slots_per_rank)
    if max_swaps > 0:
        swap_descent(slots, weight, max_swaps, 0.0, 0)
    return slots
