"""Markdown table and PNG plot for the EPLB benchmark (see :mod:`benchmarks.eplb.bench`)."""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable


@dataclass
class Result:
    """One policy on one grid point."""

    policy: str
    ranks: int
    redundant: int
    slots: int
    tokens: int
    preset: str
    inn: list[float] = field(default_factory=list)    # mean IN per window (has a next window)
    out: list[float] = field(default_factory=list)    # mean OUT per window
    in_max: float = 0.0
    moves: list[float] = field(default_factory=list)  # % of slots, windows with an old plan
    solve_s: list[float] = field(default_factory=list)
    invalid: int = 0


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _row(label: list[str], rs: list[Result]) -> str:
    inn = _mean(x for r in rs for x in r.inn)
    out = _mean(x for r in rs for x in r.out)
    in_max = max(r.in_max for r in rs)
    mv = _mean(x for r in rs for x in r.moves)
    # window 0 has no old plan: the full-solve time, the worst case
    t_mean = _mean(x for r in rs for x in r.solve_s)
    t_max = max(x for r in rs for x in r.solve_s)
    bad = sum(r.invalid for r in rs)
    cells = [f"{inn:.4f}", f"{in_max:.4f}", f"{out:.4f}", f"{mv:.1f}",
             f"{t_mean * 1e3:.0f}", f"{t_max * 1e3:.0f}", str(bad)]
    return "| " + " | ".join(label + cells) + " |"


_HEAD = ["IN mean", "IN worst layer", "OUT mean", "moves %", "solve ms mean", "solve ms max",
         "invalid"]


def _table(keys: list[str], groups: dict[tuple, list[Result]]) -> list[str]:
    cols = keys + _HEAD
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key in sorted(groups, key=lambda k: tuple(str(x).zfill(6) for x in k)):
        lines.append(_row([str(k) for k in key], groups[key]))
    return lines


def _group(results: list[Result], *attrs: str) -> dict[tuple, list[Result]]:
    out: dict[tuple, list[Result]] = defaultdict(list)
    for r in results:
        out[tuple(getattr(r, a) for a in attrs)].append(r)
    return out


def write_table(results: list[Result], jit: dict[str, float], args: argparse.Namespace,
                wall_s: float) -> str:
    """Write ``results.md`` under ``args.out_dir`` and return its text."""
    lines = [
        "# EPLB policy benchmark",
        "",
        f"Command: `python benchmarks/eplb_policies.py{' --quick' if args.quick else ''}` "
        f"(seed {args.seed}, L={args.layers}, E={args.experts}, top-k 8, "
        f"{args.windows} windows x {args.sub_windows} sub-windows, grid D={args.ranks}, "
        f"r={args.redundant}, tokens/rank/step={args.tokens}, presets={args.presets}; "
        f"wall {wall_s:.0f} s).",
        "",
        "IN = max rank load / LB on the window the plan was built from, OUT = the same on the "
        "next window, LB = max(total/D, best achievable max per-replica load). Means are over "
        "layers and windows; *IN worst layer* is the worst single layer. moves % = slots whose "
        "expert changed vs the previous plan (windows 1..W-1). Solve time = one `rebalance` "
        "call for all layers on one thread, after JIT; *max* is usually window 0 (full solve, "
        "no old plan).",
        "",
        "Warm-up (numba JIT or cache load, tiny problem, both code paths): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in jit.items()),
        "",
        "## By policy",
        "",
        *_table(["policy"], _group(results, "policy")),
        "",
        "## By slots per rank S (D, r)",
        "",
        *_table(["D", "r", "S", "policy"],
                _group(results, "ranks", "redundant", "slots", "policy")),
        "",
        "## By drift preset",
        "",
        *_table(["preset", "policy"], _group(results, "preset", "policy")),
        "",
        "## Full grid",
        "",
        *_table(["D", "r", "tokens", "preset", "policy"],
                _group(results, "ranks", "redundant", "tokens", "preset", "policy")),
        "",
    ]
    text = "\n".join(lines)
    (args.out_dir / "results.md").write_text(text)
    return text


def write_plot(results: list[Result], path: Path) -> None:
    """OUT per window index, mean over the grid, one panel per drift preset."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot")
        return
    presets = sorted({r.preset for r in results})
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        for policy, rs in _group([r for r in results if r.preset == preset], "policy").items():
            n = min(len(r.out) for r in rs)
            ys = [_mean(r.out[w] for r in rs) for w in range(n)]
            ax.plot(range(n), ys, marker="o", label=policy[0])
        ax.set_title(f"{preset} drift")
        ax.set_xlabel("window (plan built on w, scored on w+1)")
        ax.set_ylabel("OUT = max rank load / LB")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
