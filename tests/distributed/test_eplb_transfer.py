"""The EPLB D2D weight loader over the platform's NPUCommunicator (HCCL simulator): a
layer's experts reach the slots a new placement names on every rank, and an injected
failure leaves the failing rank's weights untouched without stalling its peers."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_follow_the_new_placement(cluster, seed):
    results = cluster.run("eplb_transfer", seed=seed, timeout=120)
    assert all(r["error"] is None and r["consistent"] for r in results), results
    assert sum(r["changed"] for r in results) > 0  # the random placements differ
    assert all(r["moved"] % (4 * (8 * 5 + 5 * 4)) == 0 for r in results)  # whole fp32 slots


@pytest.mark.parametrize("kind", ["error", "timeout"])
def test_injected_failure_keeps_the_old_weights(cluster2, kind):
    results = cluster2.run("eplb_transfer", seed=3, fault=f"7:1:{kind}", timeout_s=0.5,
                           timeout=120)
    assert results[0]["error"] is None and results[0]["consistent"]  # its peer finished
    message = results[1]["error"]
    assert message and ("injected transfer failure" in message if kind == "error"
                        else "timed out after" in message), message
    assert results[1]["consistent"]  # rank 1 still holds the old placement's weights
