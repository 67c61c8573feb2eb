"""docs/upstream_tests.md: the latest run of vLLM's own tests, per upstream directory."""
from __future__ import annotations

import datetime
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

from upstream_tests.allowlist import CLASSES, AllowList

REPO = Path(__file__).resolve().parent.parent


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


def write(path: Path, results: list[dict], rules: AllowList, wall_s: float,
          reused: bool = False, slice_name: str = "full") -> None:
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
        f"Latest {'full run' if slice_name == 'full' else slice_name + ' slice'}: "
        f"{datetime.date.today()}, commit {commit}, {len(results)} files, "
        f"{tests} test ids, {wall_s / 60:.1f} min "
        + ("of per-file run time, summed (files run one at a time, in several batches)"
           if reused else "wall time") + " on a 2-core machine.",
        "",
        *table(results, rules),
        "",
        "Classes of expected failures and exclusions (every entry in the allow-list gives its",
        "reason):",
        "",
        *(f"- `{name}`: {text}" for name, text in CLASSES.items()),
        "",
    ]
    path.write_text("\n".join(lines))
