"""Fixtures for the HCCL simulator tests: the library (built if needed) and "clusters" of
spawned processes, each with a gloo group on 127.0.0.1 and a PyHcclCommunicator.

A cluster lives for the whole tests/distributed package and runs many small tasks, so
process start-up (torch import, gloo rendezvous) is paid once per world size, not per case.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import workers
from vllm_npu.disagg.launch import free_port

ROOT = Path(__file__).resolve().parents[2]

# every child runs the simulator, whatever this host has
CHILD_ENV = {"NPU_PLUGIN_SIMULATE": "1", "OMP_NUM_THREADS": "1",
             # 1 MiB of staging memory: the odd sizes of the tests then span several chunks
             "HCCL_SIM_BUFFER_MB": "1"}


@pytest.fixture(scope="session")
def sim_library() -> str:
    """Path of libhccl_sim.so, (re)built by the package's build step (setup.py build_ext,
    what `make install` runs; a no-op when up to date)."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT,
                   check=True, capture_output=True)
    from vllm_npu.distributed.hccl_library import SIMULATOR_PATH

    assert SIMULATOR_PATH.is_file()
    return str(SIMULATOR_PATH)


class Cluster:
    def __init__(self, world: int, env: dict | None = None, start_timeout: float = 90.0):
        self.world = world
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world)]
        port = free_port()
        child_env = dict(CHILD_ENV, **(env or {}))
        self.procs = [ctx.Process(target=workers.worker_main,
                                  args=(r, world, port, child_env, self.tasks[r], self.results),
                                  daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()
        ready = self._collect(range(world), start_timeout, "start-up")
        errors = {r: v for r, (s, v) in ready.items() if s != "ok"}
        if errors:
            self.close()
            raise RuntimeError(f"cluster start failed: {errors}")
        self.pids = [ready[r][1]["pid"] for r in range(world)]

    def _collect(self, ranks, timeout: float, what: str) -> dict:
        want = set(ranks)
        got: dict = {}
        deadline = time.monotonic() + timeout
        while want - got.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TimeoutError(f"{what}: no answer from ranks {sorted(want - got.keys())} "
                                   f"within {timeout} s")
            try:
                rank, status, value = self.results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r in want - got.keys() if not self.procs[r].is_alive()]
                if dead:
                    self.close()
                    raise RuntimeError(f"{what}: ranks {dead} died") from None
                continue
            got[rank] = (status, value)
        return got

    def submit(self, name: str, per_rank: list[dict] | None = None, ranks=None, **kwargs):
        ranks = list(range(self.world)) if ranks is None else list(ranks)
        for r in ranks:
            self.tasks[r].put((name, per_rank[r] if per_rank else kwargs))
        return ranks

    def run_raw(self, name: str, per_rank: list[dict] | None = None, ranks=None,
                timeout: float = 60.0, **kwargs) -> dict:
        """{rank: (status, value)} for the ranks given (all by default)."""
        ranks = self.submit(name, per_rank, ranks, **kwargs)
        return self._collect(ranks, timeout, name)

    def run(self, name: str, per_rank: list[dict] | None = None, timeout: float = 60.0,
            **kwargs) -> list:
        """Each rank's result; raises if any rank raised."""
        got = self.run_raw(name, per_rank, None, timeout, **kwargs)
        errors = {r: v for r, (s, v) in got.items() if s != "ok"}
        if errors:
            raise AssertionError(f"{name}({kwargs or per_rank}) failed: " + "\n".join(
                f"rank {r}: {v['type']}: {v['message']}\n{v['traceback']}"
                for r, v in sorted(errors.items())))
        return [got[r][1] for r in range(self.world)]

    def close(self) -> None:
        for r, p in enumerate(self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    self.tasks[r].put((workers.STOP, {}))
        deadline = time.monotonic() + 10
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def shm_names(pid: int) -> list[str]:
    """Simulator segments whose root info rank `pid` created (the name embeds it)."""
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith(f"hccl_sim_{pid}_")]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="package")
def cluster2(sim_library):
    c = Cluster(2)
    yield c
    c.close()


@pytest.fixture(scope="package")
def cluster4(sim_library):
    c = Cluster(4)
    yield c
    c.close()


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def cluster(request):
    return request.getfixturevalue(f"cluster{request.param}")
