"""EPLB test helpers (numpy only): a plan's validity and lognormal expert loads."""
from __future__ import annotations

import numpy as np

from vllm_npu.eplb.policy.validate import check_placement


def assert_valid(phy2log: np.ndarray, num_layers: int, num_experts: int,
                 num_ranks: int, slots_per_rank: int) -> None:
    """Shape, dtype, every expert present, no duplicate on a rank."""
    assert phy2log.dtype == np.int64
    assert phy2log.shape == (num_layers, num_ranks * slots_per_rank)
    check_placement(phy2log, num_layers, num_experts, num_ranks, slots_per_rank, name="plan")


def lognormal_load(rng: np.random.Generator, shape: tuple[int, ...],
                   sigma: float = 1.0) -> np.ndarray:
    return np.round(rng.lognormal(0.0, sigma, size=shape) * 100.0)
