"""Benchmark runs bound by wall time, not CPU, run beside the rest of the suite.

The soak's CI run is 2 minutes of traffic whatever the machine does, and used about a third
of this machine's two cores (102 s of CPU in 150 s, measured 2026-12-07). It is scheduled
at collection and runs beside the suite's single-threaded tail (tests/helpers/
background.py); its test is moved to the end of the run and checks what the soak printed
(waiting for it if need be). A run that never reaches that test stops it at the session's
end. The other scripts start at collection, two at a time (each kept ~1.2 of the two
cores busy: 129 s one after another at 59% of the machine), and their tests take the
results in order. Under make test's two xdist workers all of them start when the worker
that took this file runs its first test (it is handed out first: tests/helpers/
scheduling.py).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import background

BACKGROUND = ("soak.py",)


def _script(item) -> str | None:
    spec = getattr(item, "callspec", None)
    if item.originalname != "test_benchmark_runs_to_the_end" or spec is None:
        return None
    return spec.params.get("script")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    if config.option.collectonly:
        return
    from tests.benchmarks.test_scripts import BENCH, RUNS

    for item in [i for i in items if _script(i)]:
        script = _script(item)
        folder = Path(tempfile.mkdtemp(prefix=f"bench-{script}-"))
        argv = [sys.executable, str(BENCH / script), *RUNS[script]]
        if script in BACKGROUND:
            items.remove(item)
            items.append(item)
            background.schedule(script, argv, folder, item.nodeid)
        else:
            background.start_soon(script, argv, folder)


def background_result(script: str, timeout_s: float):
    """The finished background run of a script, or None if it was not scheduled."""
    return background.result(script, timeout_s)


def pytest_sessionfinish(session):
    background.stop_all()
