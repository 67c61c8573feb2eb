"""docs/upstream_tests.md: the latest run of vLLM's own tests, per upstream directory."""
from __future__ import annotations

import datetime
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

from upstream_tests.allowlist import CLASSES, AllowList

REPO = Path(__file__).resolve().parent.parent
KEPT_SECTION = "## Where the full run stands"


def _directory(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _classes(counter: Counter, outcome: str) -> str:
    parts = [f"{n} {cls}" for (o, cls), n in sorted(counter.items()) if o == outcome]
    return ", ".join(parts) or "0"


def table(results: list[dict], rules: AllowList) -> list[str]:
    rows: dict[str, Counter] = defaultdict(Counter)
    files: Counter = Counter()
    for r in results:
        d = _directory(r["path"])
        files[d] += 1
        for outcome in r["tests"].values():
            kind, _, cls = outcome.partition(":")
            rows[d][(kind, cls)] += 1
    excluded_files = Counter(_directory(p) for p in rules.excluded_files())
    lines = ["| directory | files run | passed | expected-fail (by class) | excluded tests "
             "(by class) | skipped by upstream | failed | files excluded |",
             "|---|---|---|---|---|---|---|---|"]
    total, total_files = Counter(), 0
    for d in sorted(set(rows) | set(excluded_files)):
        c = rows[d]
        total.update(c)
        total_files += files[d]
        lines.append(f"| {d} | {files[d]} | {c[('passed', '')]} | {_classes(c, 'xfailed')} | "
                     f"{_classes(c, 'excluded')} | {c[('skipped', '')]} | "
                     f"{c[('failed', '')]} | {excluded_files[d]} |")
    lines.append(f"| **all** | **{total_files}** | **{total[('passed', '')]}** | "
                 f"{_classes(total, 'xfailed')} | {_classes(total, 'excluded')} | "
                 f"{total[('skipped', '')]} | **{total[('failed', '')]}** | "
                 f"{len(rules.excluded_files())} |")
    return lines


def _provenance(results: list[dict]) -> str:
    """Where stored per-file results came from: their run dates and commits."""
    dates = sorted({r["date"] for r in results if "date" in r})
    commits = sorted({r["commit"] for r in results if "commit" in r})
    return (f"stored per-file results of runs on {', '.join(dates)}"
            + (f" at commits {', '.join(commits)}" if commits else ""))


def write(path: Path, results: list[dict], rules: AllowList, wall_s: float,
          reused: bool = False, slice_name: str = "full", missing: int = 0) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    tests = sum(len(r["tests"]) for r in results)
    lines = [
        "# vLLM's own tests on the NPU plugin",
        "",
        "vLLM 0.33.0's `tests/` (from its sdist) run against the plugin on the simulated NPU,",
        "one pytest process per file, through `upstream_tests/` (the harness, the tiny local",
        "hub and the allow-list `upstream_tests/allowlist.yaml`). Reproduce with:",
        "",
        "    make upstream-test                 # everything the allow-list runs",
        "    UPSTREAM=ci make upstream-test     # the slice .ci/run includes",
        "",
        f"Latest {'full run' if slice_name == 'full' else slice_name + ' slice'}"
        + (" (assembled from stored per-file results)" if reused else "") + ": "
        f"{datetime.date.today()}, commit {commit}, {len(results)} files, "
        f"{tests} test ids, {wall_s / 60:.1f} min "
        + (f"of per-file run time, summed ({_provenance(results)}; outcomes judged under "
           "the allow-list at this commit)" if reused else "wall time")
        + " on a 2-core machine."
        + (f" {missing} listed files have no stored result yet and are not in the table "
           "(`python -m upstream_tests.run --missing` runs them)." if missing else ""),
        "",
        *table(results, rules),
        "",
        "Classes of expected failures and exclusions (every entry in the allow-list gives its",
        "reason):",
        "",
        *(f"- `{name}`: {text}" for name, text in CLASSES.items()),
        "- `?`: the test's own xfail marker (upstream's, no allow-list entry)",
        "",
    ]
    # the hand-written section after the table (what is left, how a file is run) stays
    kept = path.read_text().partition(KEPT_SECTION)[2] if path.exists() else ""
    path.write_text("\n".join(lines) + (KEPT_SECTION + kept if kept else ""))
