"""EPLB policies on drifting workload families, against vllm-ascend's own policies.

``python benchmarks/eplb_families.py [--seeds report|tuning] [--vllm-ascend]``

For each family (:mod:`benchmarks.eplb.families`), rank count D and seed, every policy
rebalances once per window on that window's sub-windows, fed its previous plan::

    IN   = peak / LB on the window it planned from      (LB: metrics.lower_bound)
    IN*  = peak / the pigeonhole MILP bound (bound.py)   (how far from optimal it really is)
    OUT  = peak / LB on the next window, the one the plan is served on

Numbers are means over layers and windows; "worst" is the worst seed's mean. Report
seeds were not used to choose any default. ``--vllm-ascend`` adds vllm-ascend's FlashLB,
SwiftBalance and default policies, run unmodified from the pinned wheel
(:mod:`benchmarks.eplb.ascend_baselines`). Writes ``docs/eplb/families.md``.
"""

from __future__ import annotations

import os
import sys

# Only before numba starts its threads: numba refuses any later change of
# NUMBA_NUM_THREADS ("Cannot set NUMBA_NUM_THREADS ... once the threads have been
# launched") on its next compile, in this process and whoever imports this module.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    if _var != "NUMBA_NUM_THREADS" or "numba" not in sys.modules:
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    from benchmarks.eplb.families import ALL_FAMILIES

    p = argparse.ArgumentParser(prog="python benchmarks/eplb_families.py",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", choices=["report", "tuning"], default="report")
    p.add_argument("--families", nargs="+", default=list(ALL_FAMILIES))
    p.add_argument("--ranks", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--redundant", type=int, default=1, help="redundant slots per rank")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--policies", nargs="+", default=None, help="default: all registered")
    p.add_argument("--vllm-ascend", action="store_true",
                   help="add vllm-ascend's policies (downloads its wheel once into --cache)")
    p.add_argument("--cache", type=Path, default=Path(".cache/eplb"))
    p.add_argument("--no-bound", action="store_true", help="skip the MILP bound (IN*)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="each rebalance's deadline (our policies; the runtime's is 0.5 s)")
    p.add_argument("--out", type=Path, default=Path("docs/eplb/families.md"))
    return p.parse_args(argv)


def _make(name: str, num_ranks: int, source: Path | None):
    from benchmarks.eplb.ascend_baselines import AscendBaseline
    from vllm_npu.eplb.policy import get_policy

    return AscendBaseline(name, source, num_ranks) if name.startswith("va-") else \
        get_policy(name)


def run(args: argparse.Namespace) -> tuple[list[dict], float]:
    from vllm_npu.eplb.policy.bound import milp_bound
    from benchmarks.eplb.families import REPORT_SEEDS, TUNING_SEEDS, FamilyConfig, generate_family
    from vllm_npu.eplb.policy.metrics import imbalance, moved_slots, rank_loads
    from vllm_npu.eplb.policy import available_policies

    names = list(args.policies or available_policies())
    source = None
    if args.vllm_ascend:
        from benchmarks.eplb.ascend_baselines import BASELINES, ensure_source

        source = ensure_source(args.cache)
        names += list(BASELINES)
    seeds = REPORT_SEEDS if args.seeds == "report" else TUNING_SEEDS
    rows = []
    t_start = time.perf_counter()
    for fam in args.families:
        for d in args.ranks:
            s = 256 // d + args.redundant
            for seed in seeds:
                cfg = FamilyConfig(family=fam, num_layers=args.layers, num_ranks=d,
                                   num_windows=args.windows, seed=seed)
                data = generate_family(cfg)
                totals = data.sum(axis=1)
                bounds = None if args.no_bound else np.array(
                    [[milp_bound(totals[v, layer], d, s) for layer in range(args.layers)]
                     for v in range(args.windows)])
                for name in names:
                    pol = _make(name, d, source)
                    prev = None
                    ins, ins_star, outs, moves, times = [], [], [], [], []
                    for w in range(args.windows):
                        t0 = time.perf_counter()
                        plan = pol.rebalance(data[w], num_ranks=d, slots_per_rank=s,
                                             old_phy2log=prev, history=totals[:w],
                                             deadline_s=args.deadline_s)
                        times.append(time.perf_counter() - t0)
                        ins.append(float(imbalance(totals[w], plan, d, s).mean()))
                        outs.append(float(imbalance(totals[w + 1], plan, d, s).mean()))
                        if bounds is not None:
                            peak = rank_loads(totals[w], plan, d).max(axis=1)
                            ins_star.append(float((peak / np.maximum(bounds[w], 1e-12)).mean()))
                        if prev is not None:
                            moves.append(100.0 * float(moved_slots(prev, plan).sum()) / plan.size)
                        prev = plan
                    rows.append(dict(family=fam, ranks=d, slots=s, seed=seed, policy=name,
                                     inn=np.mean(ins), inn_star=np.mean(ins_star) if ins_star
                                     else float("nan"), out=np.mean(outs),
                                     moves=np.mean(moves) if moves else 0.0,
                                     ms=1000 * np.mean(times[1:] or times)))
                print(f"{fam} D={d} seed={seed}: " + "  ".join(
                    f"{r['policy']} {r['inn']:.4f}/{r['out']:.4f}" for r in rows[-len(names):]),
                    flush=True)
    return rows, time.perf_counter() - t_start


def table(rows: list[dict], args: argparse.Namespace, wall: float) -> str:
    from benchmarks.eplb.families import TUNED_ON

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["family"], r["ranks"], r["slots"], r["policy"])].append(r)
    lines = [
        "# EPLB policies on drifting workload families",
        "",
        f"Command: `python benchmarks/eplb_families.py {' '.join(args.argv)}` (E=256, "
        f"{args.windows} rebalances, 8 sub-windows of history each, r={args.redundant}"
        f"{f', deadline {args.deadline_s} s' if args.deadline_s else ''}; "
        f"wall {wall:.0f} s). Seeds: {args.seeds}.",
        "",
        f"Defaults may be chosen on: {', '.join(TUNED_ON)} (tuning seeds only). Held out "
        "(*set* = held out): every other family, never used to choose a default.",
        "",
        "IN = peak / LB on the planned window, IN* = peak / pigeonhole MILP bound (a true "
        "lower bound, `vllm_npu/eplb/policy/bound.py`), OUT = peak / LB on the next window "
        "(the one served). "
        "Mean over seeds, layers and windows; *OUT worst* is the worst seed's mean. `va-*` are "
        "vllm-ascend's policies run unmodified.",
        "",
        "| family | set | D | S | policy | IN | IN* | OUT | OUT worst | moves % | solve ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (fam, d, s, name), rs in groups.items():
        lines.append(
            f"| {fam} | {'tuned' if fam in TUNED_ON else 'held out'} | {d} | {s} | {name} | {np.mean([r['inn'] for r in rs]):.4f} | "
            f"{np.mean([r['inn_star'] for r in rs]):.4f} | {np.mean([r['out'] for r in rs]):.4f} "
            f"| {max(r['out'] for r in rs):.4f} | {np.mean([r['moves'] for r in rs]):.1f} | "
            f"{np.mean([r['ms'] for r in rs]):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    rows, wall = run(args)
    md = table(rows, args, wall)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
