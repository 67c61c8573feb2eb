"""Expert-parallel load balancing (EPLB) policies.

A policy maps a window of per-expert token load to a placement ``phy2log``:
which logical expert sits in each physical slot of each rank.  numpy, numba
and scipy only; no torch.

>>> from vllm_npu.eplb.policy import get_policy
>>> phy2log = get_policy("flashlb").rebalance(load, num_ranks=D, slots_per_rank=S)

Names are re-exported lazily so ``python -m benchmarks.eplb.bench`` can set
thread limits before numpy loads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["available_policies", "get_policy"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from vllm_npu.eplb import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
