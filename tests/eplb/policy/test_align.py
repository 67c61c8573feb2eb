"""Hungarian alignment: never more moves, same rank contents, finds pure relabelings."""

from __future__ import annotations

import numpy as np
import pytest
from tests.helpers.eplb import lognormal_load

from vllm_npu.eplb.policy.align import align_layer
from vllm_npu.eplb.policy.metrics import moved_slots
from vllm_npu.eplb.policy import get_policy


def _tables(seed: int, d: int = 8, s: int = 5, e: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pol = get_policy("default")
    old = pol.rebalance(lognormal_load(rng, (1, e)), d, s)[0].reshape(d, s)
    new = pol.rebalance(lognormal_load(rng, (1, e)), d, s)[0].reshape(d, s)
    return old, new


@pytest.mark.parametrize("seed", range(20))
def test_alignment_never_increases_moves(seed: int) -> None:
    old, new = _tables(seed)
    aligned = align_layer(new, old, 32)
    assert moved_slots(old.ravel(), aligned.ravel()) <= moved_slots(old.ravel(), new.ravel())
    # same rank contents, only relabelled / reordered
    assert sorted(map(tuple, np.sort(aligned, axis=1))) == sorted(map(tuple, np.sort(new, axis=1)))


@pytest.mark.parametrize("seed", range(5))
def test_alignment_undoes_permutation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    old, _ = _tables(seed)
    shuffled = old[rng.permutation(old.shape[0])]
    shuffled = np.array([row[rng.permutation(row.size)] for row in shuffled])
    assert moved_slots(old.ravel(), shuffled.ravel()) > 0
    assert np.array_equal(align_layer(shuffled, old, 32), old)
