"""Work that runs beside the suite's single-threaded tail.

The suite's last minutes (EPLB policies, ops, packaging, the upstream harness; measured
2026-12-07: ~5 minutes at 50% of this machine's two cores) leave a core idle, while its
first minutes and its engine tests keep both busy. So runs bound by wall time, not CPU
(the soak's 2-minute CI run), are scheduled at collection and start when the first test of
that tail starts (tests/conftest.py), and so does anything waiting on the file named by
NPU_SUITE_TAIL_FILE (.ci/run starts vLLM's CI slice then). A run whose test comes before
the tail, or a selection without one, starts when its result is asked for.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENGINE_DIRS = ("tests/attention/", "tests/benchmarks/", "tests/compilation/",
               "tests/distributed/", "tests/e2e/")  # the ones that keep both cores busy
_pending: dict[str, tuple[list[str], Path]] = {}
_running: dict[str, tuple[subprocess.Popen, Path]] = {}
_tests: set[str] = set()  # the scheduled runs' own tests (moved to the end of the run)


def schedule(name: str, argv: list[str], folder: Path, test: str) -> None:
    """Run ``argv`` in ``folder`` (stdout and stderr to folder/stdout.txt) once the tail
    starts; ``test`` is the node id of the test that checks it."""
    _pending[name] = (argv, folder)
    _tests.add(test)


def tail_start(nodeids: list[str]) -> str | None:
    """The first test after the last engine test (the scheduled runs' own tests, moved to
    the end, not counted), or None when the selection has no test there."""
    last = -1
    for i, nodeid in enumerate(nodeids):
        if nodeid.startswith(ENGINE_DIRS) and nodeid not in _tests:
            last = i
    return nodeids[last + 1] if last + 1 < len(nodeids) else None


def start_all() -> None:
    """Start every scheduled run, and tell whoever waits on NPU_SUITE_TAIL_FILE."""
    for name in list(_pending):
        _start(name)
    flag = os.environ.get("NPU_SUITE_TAIL_FILE")
    if flag:
        Path(flag).touch()


def _start(name: str) -> None:
    argv, folder = _pending.pop(name)
    out = open(folder / "stdout.txt", "w")
    _running[name] = (subprocess.Popen(argv, cwd=folder, stdout=out,
                                       stderr=subprocess.STDOUT, text=True), folder)


def result(name: str, timeout_s: float) -> subprocess.CompletedProcess | None:
    """The finished run ``name`` (started now if the tail has not come), or None if it was
    never scheduled."""
    if name in _pending:
        _start(name)
    if name not in _running:
        return None
    proc, folder = _running.pop(name)
    proc.wait(timeout=timeout_s)
    text = (folder / "stdout.txt").read_text()
    return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")


def stop_all() -> None:
    for proc, _ in _running.values():
        proc.kill()
        proc.wait()
    _running.clear()
    _pending.clear()
    _tests.clear()
