"""Fixtures the end-to-end test modules share."""
from __future__ import annotations

import pytest


@pytest.fixture
def spawn_workers(monkeypatch):
    """TP engines start their workers with spawn, not fork: after in-process engines that
    captured MoE graphs, a forked worker's first gc.collect() finalised a gloo process
    group inherited from the parent and hung joining threads the child does not have
    (DeviceMemoryProfiler in load_model). A served engine starts from a fresh process and
    never meets this. Use with `pytestmark = pytest.mark.usefixtures("spawn_workers")` in
    every module that starts TP/DP workers after in-process MoE engines may have run
    (test_device_dtype_parity runs MoE models in-process, before test_context_parallel)."""
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
