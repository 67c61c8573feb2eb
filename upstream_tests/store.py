"""Per-file results of upstream runs, kept in the repository (upstream_tests/results/).

A full run of the allow-list takes longer than one working session on a 2-core machine,
and build/ does not survive a fresh clone: the runner records each file's outcome here as
it finishes, so the report can be assembled from runs made at different times (each
record says its commit and date) and judged under the allow-list as it is now.

One JSON file per upstream top-level directory (`tests/v1/...` -> `v1.json`), keyed by
test file; per file the raw outcome of every test as the plugin judged it when it ran
(the node id after the file), and for tests that failed outright the failure's message
and the end of its text, enough to match a known failure added to the allow-list later.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
from pathlib import Path

STORE = Path(__file__).with_name("results")
TEXT_KEPT = 3000   # characters of a failure's text kept (its end: where the error is)


def _file_for(path: str) -> Path:
    parts = path.split("/")
    top = parts[1].removesuffix(".py") if len(parts) > 2 else "top-level"
    return STORE / f"{top}.json"


@contextlib.contextmanager
def _locked():
    """Runners started side by side write the same files: one writer at a time."""
    STORE.mkdir(exist_ok=True)
    with open(STORE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read(file: Path) -> dict:
    if not file.exists():
        return {}
    return _parsed(file, file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _parsed(file: Path, mtime_ns: int) -> dict:
    """One parse per file version (a report reads hundreds of records from a few files);
    callers copy before changing."""
    return json.loads(file.read_text())


def save(path: str, record: dict) -> None:
    """Record one file's result (rc, seconds, commit, date, cases, failures)."""
    file = _file_for(path)
    with _locked():
        data = dict(_read(file))
        data[path] = record
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(data.items())), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, file)


def load(path: str) -> dict | None:
    return _read(_file_for(path)).get(path)


def paths() -> list[str]:
    """Every test file with a stored result."""
    return sorted(p for file in STORE.glob("*.json") for p in _read(file))


def failure_kept(message: str, text: str) -> list[str]:
    """What a failure keeps: its message and the end of its text."""
    return [message[:TEXT_KEPT], text[-TEXT_KEPT:]]
