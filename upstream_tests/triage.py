"""Group the failures of stored upstream results by message, to write allow-list entries.

    python -m upstream_tests.triage tests/config tests/v1/sample   # files under these
    python -m upstream_tests.triage --unlisted                     # results of files the
                                                                   # allow-list lacks

Reads the stored results (upstream_tests/results/, run.py records them), each listed
file's outcomes re-judged under its allow-list entry as it is now; prints each distinct
first failure line (numbers and quoted names folded) with how many tests and which files
hit it, then each file's counts. `--failing` prints only the paths of files with a failure left (to
run them again). Running nothing, it only reads what the runner stored.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

from upstream_tests import allowlist, store
from upstream_tests.run import outcome_counts, stored_result

FOLD = [(re.compile(r"'[^']*'"), "'…'"), (re.compile(r"\d+"), "N")]


def fold(message: str) -> str:
    for pattern, repl in FOLD:
        message = pattern.sub(repl, message)
    return message[:160]


def stored(prefixes: list[str], unlisted: bool) -> list[dict]:
    rules = allowlist.load()
    out = []
    for name in store.paths():
        if prefixes and not name.startswith(tuple(prefixes)):
            continue
        if unlisted and name in rules.files:
            continue
        out.append(stored_result(name, rules.entry(name) if name in rules.files else None))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefixes", nargs="*", help="only files whose path starts so")
    ap.add_argument("--unlisted", action="store_true", help="only files not in the list")
    ap.add_argument("--failing", action="store_true",
                    help="only print the files with a failure left")
    args = ap.parse_args(argv)
    results = stored(args.prefixes, args.unlisted)
    if args.failing:
        print("\n".join(r["path"] for r in results if "failed" in r["tests"].values()))
        return
    groups: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        for test, outcome in r["tests"].items():
            if outcome == "failed":
                message = r["failures"].get(test) or "(no message: crashed or not collected)"
                groups[fold(message)][r["path"]] += 1
    for message, files in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{sum(files.values()):5d}  {message}")
        for f, n in files.most_common(4):
            print(f"         {n:4d} {f}")
        if len(files) > 4:
            print(f"         ... {len(files) - 4} more files")
    print()
    for r in results:
        counts = outcome_counts(r["tests"])
        print(f"{r['path']}: " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
              + f" ({r['seconds']} s)")


if __name__ == "__main__":
    main()
