"""Input and placement validation shared by every policy.

Layout convention (one layer, D ranks, S slots per rank)::

    phy2log[l] = [ e e e | e e e | ... | e e e ]
                   rank 0   rank 1        rank D-1      (slot d*S + s)

Every error is a ``ValueError`` that names the bad value and what is valid.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Problem:
    """A validated rebalance request.

    ``windows`` is always ``[T, L, E]`` (a 2-D load becomes ``T == 1``);
    ``load`` is its sum over sub-windows, the aggregate the metrics use. ``history`` is
    ``[H, L, E]``, the totals of earlier windows (oldest first), or None; ``deadline`` the
    ``time.perf_counter()`` by which the plan is due, or None.
    """

    windows: np.ndarray
    load: np.ndarray
    num_ranks: int
    slots_per_rank: int
    old: np.ndarray | None
    history: np.ndarray | None = None
    deadline: float | None = None

    def time_left(self) -> float:
        """Seconds until the deadline (inf without one)."""
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    @property
    def num_layers(self) -> int:
        return int(self.load.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.load.shape[1])

    @property
    def num_slots(self) -> int:
        return self.num_ranks * self.slots_per_rank


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {int(value)}")
    return int(value)


def check_load(load: object) -> np.ndarray:
    """Return ``load`` as float64 ``[T, L, E]``; reject bad shapes and values."""
    arr = np.asarray(load)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
    ):
        raise ValueError(f"load must be a numeric array, got dtype {arr.dtype}")
    if arr.ndim not in (2, 3):
        raise ValueError(
            f"load must have shape [L, E] or [T, L, E], got ndim={arr.ndim} "
            f"(shape {arr.shape})"
        )
    if 0 in arr.shape:
        raise ValueError(f"load must be non-empty in every dimension, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValueError(
            f"load must be finite, got {arr[tuple(bad)]} at index {bad} (NaN/inf not allowed)"
        )
    if np.any(arr < 0):
        bad = np.argwhere(arr < 0)[0].tolist()
        raise ValueError(f"load must be >= 0, got {arr[tuple(bad)]} at index {bad}")
    return arr if arr.ndim == 3 else arr[None]


def check_geometry(num_experts: int, num_ranks: object, slots_per_rank: object) -> tuple[int, int]:
    """Validate ``D`` and ``S`` against ``E``: ``E <= D*S`` and ``S <= E``."""
    d = _positive_int(num_ranks, "num_ranks")
    s = _positive_int(slots_per_rank, "slots_per_rank")
    if d * s < num_experts:
        raise ValueError(
            f"num_ranks*slots_per_rank = {d}*{s} = {d * s} < num_experts = {num_experts}; "
            f"need at least {num_experts} slots (e.g. slots_per_rank >= {-(-num_experts // d)})"
        )
    if s > num_experts:
        # A rank's S slots need S distinct experts.
        raise ValueError(
            f"slots_per_rank = {s} > num_experts = {num_experts}: a rank would have to hold "
            f"an expert twice; slots_per_rank must be <= {num_experts}"
        )
    return d, s


def check_placement(phy2log: object, num_layers: int, num_experts: int,
                    num_ranks: int, slots_per_rank: int, name: str = "old_phy2log") -> np.ndarray:
    """Return ``phy2log`` as int64 ``[L, D*S]`` or raise if it is not a valid placement."""
    n = num_ranks * slots_per_rank
    arr = np.asarray(phy2log)
    if arr.shape != (num_layers, n):
        raise ValueError(
            f"{name} must have shape [L, D*S] = [{num_layers}, {n}], got {arr.shape}"
        )
    if not (np.issubdtype(arr.dtype, np.integer)):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)) \
                or np.any(arr != np.round(arr)):
            raise ValueError(f"{name} must hold integer expert ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= num_experts:
        bad = arr.min() if arr.min() < 0 else arr.max()
        raise ValueError(
            f"{name} holds expert id {bad}; valid ids are 0..{num_experts - 1}"
        )
    for layer in range(num_layers):
        row = arr[layer]
        missing = np.setdiff1d(np.arange(num_experts), row)
        if missing.size:
            raise ValueError(
                f"{name} layer {layer} is missing expert {int(missing[0])}: every expert "
                f"needs at least one slot"
            )
        per_rank = np.sort(row.reshape(num_ranks, slots_per_rank), axis=1)
        dup = np.argwhere(per_rank[:, 1:] == per_rank[:, :-1])
        if dup.size:
            rank = int(dup[0, 0])
            raise ValueError(
                f"{name} layer {layer} rank {rank} holds expert "
                f"{int(per_rank[rank, dup[0, 1]])} twice; a rank may hold each expert once"
            )
    return arr


def check_history(history: object, num_layers: int, num_experts: int) -> np.ndarray | None:
    """Earlier windows' totals as float64 ``[H, L, E]`` (a list of ``[L, E]`` is stacked), or
    None for none (also ``H == 0``); reject bad shapes and values as :func:`check_load` does."""
    if history is None or (isinstance(history, (list, tuple)) and not history):
        return None
    arr = np.asarray(history)
    if arr.ndim != 3 or arr.shape[1:] != (num_layers, num_experts):
        raise ValueError(f"history must have shape [H, L, E] = [H, {num_layers}, "
                         f"{num_experts}] (earlier windows' totals), got {arr.shape}")
    if arr.shape[0] == 0:
        return None
    try:
        return check_load(arr)
    except ValueError as e:
        raise ValueError(str(e).replace("load", "history", 1)) from None


def check_deadline(deadline_s: object) -> float | None:
    """``deadline_s`` (seconds from now, > 0, or None) as an absolute perf_counter."""
    if deadline_s is None:
        return None
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, numbers.Real) \
            or not np.isfinite(deadline_s) or deadline_s <= 0:
        raise ValueError(f"deadline_s must be a positive number of seconds or None, got "
                         f"{deadline_s!r}")
    return time.perf_counter() + float(deadline_s)


def check_request(load: object, num_ranks: object, slots_per_rank: object,
                  old_phy2log: object | None, history: object | None = None,
                  deadline_s: object | None = None) -> Problem:
    """Validate a full ``rebalance`` call."""
    deadline = check_deadline(deadline_s)
    windows = check_load(load)
    _, num_layers, num_experts = windows.shape
    d, s = check_geometry(num_experts, num_ranks, slots_per_rank)
    old = None
    if old_phy2log is not None:
        old = check_placement(old_phy2log, num_layers, num_experts, d, s)
    return Problem(windows=windows, load=windows.sum(axis=0), num_ranks=d,
                   slots_per_rank=s, old=old,
                   history=check_history(history, num_layers, num_experts), deadline=deadline)
