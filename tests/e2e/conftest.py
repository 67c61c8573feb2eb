"""Fixtures the end-to-end test modules share."""
from __future__ import annotations

import pytest


@pytest.fixture
def spawn_workers(monkeypatch):
    """TP engines start their workers with spawn, not fork (vLLM's default here). Once an
    in-process engine has run in this process the platform spawns them anyway (the NPU is
    initialised here: vllm_npu/fork_safety.py); this makes a module run on its own do the
    same. Forks would also copy this process: it holds 10-11 GB late in the suite, and
    forked workers took the host to 23 GB of 24 (measured 2026-12-06). Use with
    `pytestmark = pytest.mark.usefixtures("spawn_workers")` in every module that starts
    TP/DP workers in-process."""
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


@pytest.fixture(scope="session")
def engine_host(tmp_path_factory):
    """One process for the session's multi-worker engines, whose workers fork from it
    (tests/helpers/engine_host.py); its log is in the fixture's tmp folder."""
    from tests.helpers.engine_host import EngineHost

    with EngineHost(log=tmp_path_factory.mktemp("engine_host") / "host.log") as host:
        yield host
