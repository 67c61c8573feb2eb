"""LPT packing on arbitrary replica counts (FlashTree's shifts are not water-filled)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy.packing import packed_layer


def _assert_packs(slots: np.ndarray, cnt: np.ndarray, d: int, s: int) -> None:
    assert slots.shape == (d, s) and slots.dtype == np.int64
    assert all(len(set(row)) == s for row in slots.tolist()), "expert twice on a rank"
    assert np.array_equal(np.bincount(slots.ravel(), minlength=cnt.size), cnt)


@pytest.mark.parametrize("max_swaps", [0, 4096])
def test_stuck_replica_is_placed(max_swaps: int) -> None:
    # expert 5's last replica finds only ranks that already hold it: the stuck path
    cnt = np.array([1, 3, 1, 1, 2, 4, 3], np.int64)
    load = np.array([3.0, 1, 2, 1, 1, 1, 1]) * cnt
    slots = packed_layer(load, cnt, 5, 3, max_swaps)
    _assert_packs(slots, cnt, 5, 3)
    if max_swaps == 0:
        assert slots.tolist() == [[0, 6, 1], [2, 5, 6], [6, 3, 5], [1, 4, 5], [1, 4, 5]]


@pytest.mark.parametrize("seed", range(10))
def test_random_counts_pack_validly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(50):
        d, s = (int(x) for x in rng.integers(2, 7, size=2))
        e = int(rng.integers(s, d * s + 1))
        cnt = np.ones(e, np.int64)
        for _ in range(d * s - e):
            cnt[rng.choice(np.flatnonzero(cnt < d))] += 1
        load = rng.integers(0, 4, e).astype(np.float64)  # ties and zeros
        _assert_packs(packed_layer(load, cnt, d, s, 4096), cnt, d, s)
