"""Shared fixtures for the EPLB tests (pure numpy/numba/scipy, no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy import available_policies
from vllm_npu.eplb.validate import check_placement


def assert_valid(phy2log: np.ndarray, num_layers: int, num_experts: int,
                 num_ranks: int, slots_per_rank: int) -> None:
    """Shape, dtype, every expert present, no duplicate on a rank."""
    assert phy2log.dtype == np.int64
    assert phy2log.shape == (num_layers, num_ranks * slots_per_rank)
    check_placement(phy2log, num_layers, num_experts, num_ranks, slots_per_rank, name="plan")


@pytest.fixture(params=available_policies())
def policy_name(request: pytest.FixtureRequest) -> str:
    return request.param


def lognormal_load(rng: np.random.Generator, shape: tuple[int, ...],
                   sigma: float = 1.0) -> np.ndarray:
    return np.round(rng.lognormal(0.0, sigma, size=shape) * 100.0)
