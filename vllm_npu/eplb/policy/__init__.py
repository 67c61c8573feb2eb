"""EPLB placement policies: the interface and registry (this module), one module per
policy (default, swift, flashlb, budget, lookahead) and their building blocks (packing,
incremental repair, alignment, scenarios, bounds, exact solvers, metrics, validation).
numpy, numba and scipy only: no torch, no vLLM.

>>> policy = get_policy("flashlb")
>>> phy2log = policy.rebalance(load, num_ranks=D, slots_per_rank=S, old_phy2log=None,
...                            history=None, deadline_s=None)

``load`` is ``[L, E]`` or ``[T, L, E]`` (sub-windows, oldest first); the result
is int64 ``[L, D*S]`` with rank ``d`` owning slots ``d*S .. d*S + S-1``. ``history``
holds earlier windows' ``[L, E]`` totals, oldest first (the caller keeps them, so a
policy instance holds no memory a restart could lose); ``deadline_s`` bounds the call:
a policy that plans in stages returns its best plan so far when it runs out.
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod

import numpy as np

from vllm_npu.eplb.policy.validate import Problem, check_request


class Policy(ABC):
    """Base class: validates the request, then calls :meth:`solve`."""

    name: str = ""

    def rebalance(self, load: np.ndarray, num_ranks: int, slots_per_rank: int,
                  old_phy2log: np.ndarray | None = None, history: np.ndarray | None = None,
                  deadline_s: float | None = None) -> np.ndarray:
        """Return the new placement ``phy2log`` ``[L, D*S]`` (int64)."""
        problem = check_request(load, num_ranks, slots_per_rank, old_phy2log, history,
                                deadline_s)
        out = np.ascontiguousarray(self.solve(problem), dtype=np.int64)
        assert out.shape == (problem.num_layers, problem.num_slots)
        return out

    @abstractmethod
    def solve(self, problem: Problem) -> np.ndarray:
        """Placement for an already-validated problem."""


# name -> "module:Class", imported lazily so one policy's import cost stays its own.
_REGISTRY: dict[str, str] = {
    "default": "vllm_npu.eplb.policy.default:DefaultPolicy",
    "swift": "vllm_npu.eplb.policy.swift:SwiftPolicy",
    "flashlb": "vllm_npu.eplb.policy.flashlb:FlashLBPolicy",
    "budget": "vllm_npu.eplb.policy.budget:BudgetPolicy",
    "lookahead": "vllm_npu.eplb.policy.lookahead:LookaheadPolicy",
}


def available_policies() -> list[str]:
    """Names accepted by :func:`get_policy`."""
    return list(_REGISTRY)


def policy_options(name: str) -> dict[str, object]:
    """The tuning options policy ``name`` accepts, with their defaults."""
    cls = _policy_class(name)
    return {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.default is not inspect.Parameter.empty}


def get_policy(name: str, **options: float) -> Policy:
    """A fresh policy instance by name, with optional tuning ``options`` (numbers, see
    :func:`policy_options`); an unknown name or option, or a non-number, raises
    ``ValueError``."""
    valid = policy_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for EPLB policy {name!r}; valid: "
                         f"{sorted(valid)}")
    options = dict(options)
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"EPLB policy {name!r} option {key!r} must be a number, got "
                             f"{value!r} (default {valid[key]!r})")
        if isinstance(valid[key], int) and not isinstance(value, int):
            if not float(value).is_integer():  # a count (sub-windows, tree depth, ...)
                raise ValueError(f"EPLB policy {name!r} option {key!r} must be a whole "
                                 f"number, got {value!r} (default {valid[key]!r})")
            options[key] = int(value)
    return _policy_class(name)(**options)


def _policy_class(name: str) -> type[Policy]:
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown EPLB policy {name!r}; valid names: {', '.join(available_policies())}"
        )
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)
