"""Fixtures the end-to-end test modules share."""
from __future__ import annotations

import pytest


@pytest.fixture
def spawn_workers(monkeypatch):
    """TP engines start their workers with spawn, not fork (vLLM's default here). Forks of
    this process are safe since the platform prepares them (vllm_npu/fork_safety.py: an
    earlier engine's gloo group, numba's OpenMP pool) and are 2-5x faster to start (no
    re-import of vLLM), but this process holds 10-11 GB late in the suite and its forked
    workers copied several GB of it each: 23 GB used of 24 with a TP=2 + EP worker at
    13.9 GB RSS (measured 2026-12-06). Use with
    `pytestmark = pytest.mark.usefixtures("spawn_workers")` in every module that starts
    TP/DP workers in-process."""
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
