"""Work that runs beside the suite's single-threaded tail.

The suite's last minutes (EPLB policies, ops, packaging, the upstream harness; measured
2026-12-07: ~5 minutes at 50% of this machine's two cores) leave a core idle, while its
first minutes and its engine tests keep both busy. So runs bound by wall time, not CPU
(the soak's 2-minute CI run), are scheduled at collection and start when the first test of
that tail starts (tests/conftest.py), and so does anything waiting on the file named by
NPU_SUITE_TAIL_FILE (.ci/run starts vLLM's CI slice then). A run whose test comes before
the tail, or a selection without one, starts when its result is asked for.

Short CPU-light runs (the benchmark scripts at their smallest settings: 1.2 of the two
cores each, measured) instead start at collection, two at a time (:func:`start_soon`), and
their tests take the results in order.

Under `pytest -n N` (make test: tests/helpers/scheduling.py) there is no such tail: the
workers fill each other's idle core. Every worker collects the whole suite, so nothing
starts at collection: the runs start when the worker that took their tests asks for the
first result, and whatever waits on NPU_SUITE_TAIL_FILE starts with the session.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ENGINE_DIRS = ("tests/attention/", "tests/benchmarks/", "tests/compilation/",
               "tests/distributed/", "tests/e2e/")  # the ones that keep both cores busy
_pending: dict[str, tuple[list[str], Path]] = {}
_running: dict[str, tuple[subprocess.Popen, Path]] = {}
_tests: set[str] = set()  # the scheduled runs' own tests (moved to the end of the run)
_soon: dict[str, tuple[Future, Path]] = {}
_pool: list[ThreadPoolExecutor] = []
_deferred: dict[str, tuple[list[str], Path, int]] = {}  # start_soon's runs in a worker
PARALLEL = bool(os.environ.get("PYTEST_XDIST_WORKER"))  # this process is an xdist worker


def parallel_controller(config) -> bool:
    """True in the process that hands tests to pytest-xdist workers."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def schedule(name: str, argv: list[str], folder: Path, test: str) -> None:
    """Run ``argv`` in ``folder`` (stdout and stderr to folder/stdout.txt) once the tail
    starts; ``test`` is the node id of the test that checks it."""
    _pending[name] = (argv, folder)
    _tests.add(test)


def start_soon(name: str, argv: list[str], folder: Path, at_once: int = 2) -> None:
    """Run ``argv`` in ``folder`` now, at most ``at_once`` of these runs at a time (in the
    order given); in an xdist worker, when the first result is asked for."""
    if PARALLEL:
        _deferred[name] = (argv, folder, at_once)
    else:
        _submit(name, argv, folder, at_once)


def _submit(name: str, argv: list[str], folder: Path, at_once: int) -> None:
    if not _pool:
        _pool.append(ThreadPoolExecutor(at_once, thread_name_prefix="bench-run"))
    _soon[name] = (_pool[0].submit(subprocess.run, argv, cwd=folder, capture_output=True,
                                   text=True, timeout=600), folder)


def tail_start(nodeids: list[str]) -> str | None:
    """The first test after the last engine test (the scheduled runs' own tests, moved to
    the end, not counted), or None when the selection has no test there or the run has no
    single-threaded tail (xdist)."""
    if PARALLEL:
        return None
    last = -1
    for i, nodeid in enumerate(nodeids):
        if nodeid.startswith(ENGINE_DIRS) and nodeid not in _tests:
            last = i
    return nodeids[last + 1] if last + 1 < len(nodeids) else None


def start_all() -> None:
    """Start every scheduled run, and tell whoever waits on NPU_SUITE_TAIL_FILE."""
    for name in list(_pending):
        _start(name)
    tell_the_tail_file()


def tell_the_tail_file() -> None:
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
    if PARALLEL and (_deferred or _pending):  # a worker's first result: start all it holds
        for run in list(_pending):
            _start(run)
        for run, (argv, folder, at_once) in list(_deferred.items()):
            _submit(run, argv, folder, at_once)
        _deferred.clear()
    if name in _soon:
        future, folder = _soon.pop(name)
        try:
            return future.result(timeout=timeout_s)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if name in _pending:
        _start(name)
    if name not in _running:
        return None
    proc, folder = _running.pop(name)
    proc.wait(timeout=timeout_s)
    text = (folder / "stdout.txt").read_text()
    shutil.rmtree(folder, ignore_errors=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")


def stop_all() -> None:
    for future, folder in _soon.values():
        future.cancel()
        shutil.rmtree(folder, ignore_errors=True)
    if _pool:
        _pool.pop().shutdown(wait=True)  # a started run ends within its timeout
    _soon.clear()
    for proc, _ in _running.values():
        proc.kill()
        proc.wait()
    _running.clear()
    for folder in [f for _, f in _pending.values()] + [f for _, f, _ in _deferred.values()]:
        shutil.rmtree(folder, ignore_errors=True)  # runs this process never started
    _pending.clear()
    _deferred.clear()
    _tests.clear()
