"""EPLB policy benchmark: ``python benchmarks/eplb_policies.py [--quick]``.

For every grid point (ranks D, redundant slots per rank r, tokens per rank,
drift preset) a seeded workload of W windows is generated and each policy
rebalances once per window, fed its own previous plan::

    window:   w0      w1      w2     ...
    plan:     p0 ---> p1 ---> p2          (old_phy2log = previous plan)
    IN  = imbalance(p_w, load_w)    OUT = imbalance(p_w, load_{w+1})

Metrics are written to ``docs/eplb/results.md`` and ``out_over_windows.png``.
"""

from __future__ import annotations

import os
import sys

# One thread, as the target asks; set before numpy / numba load.
# Only before numba starts its threads: numba refuses any later change of
# NUMBA_NUM_THREADS ("Cannot set NUMBA_NUM_THREADS ... once the threads have been
# launched") on its next compile, in this process and whoever imports this module.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    if _var != "NUMBA_NUM_THREADS" or "numba" not in sys.modules:
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.eplb.report import Result, write_plot, write_table  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/eplb_policies.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="reduced grid: D in {32,128}, r in {1,2}, 128 tokens, moderate+stable, "
                        "4 windows")
    p.add_argument("--ranks", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--redundant", type=int, nargs="+", default=[1, 2])
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 4096])
    p.add_argument("--presets", nargs="+", default=["stable", "moderate", "shifting"])
    p.add_argument("--policies", nargs="+", default=None, help="default: all registered")
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--sub-windows", type=int, default=4)
    p.add_argument("--layers", type=int, default=58)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=Path("docs/eplb"))
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--cold-jit", action="store_true",
                   help="compile into an empty numba cache dir to time a cold JIT")
    args = p.parse_args(argv)
    if args.quick:
        args.ranks, args.tokens = [32, 128], [128]
        args.presets, args.windows = ["stable", "moderate"], 4
    return args


def _warm_up(names: list[str]) -> dict[str, float]:
    """Time each policy's first call on a tiny problem: numba JIT (or cache load)."""
    import numpy as np

    from vllm_npu.eplb.policy import get_policy

    rng = np.random.default_rng(0)
    load = rng.random((2, 3, 16)) * 10
    out = {}
    for name in names:
        pol = get_policy(name)
        t0 = time.perf_counter()
        first = pol.rebalance(load, num_ranks=4, slots_per_rank=5)
        pol.rebalance(load * rng.random(load.shape), num_ranks=4, slots_per_rank=5,
                      old_phy2log=first)
        out[name] = time.perf_counter() - t0
    return out


def run_point(names: list[str], ranks: int, redundant: int, tokens: int, preset: str,
              args: argparse.Namespace) -> list[Result]:
    """All policies on one grid point."""
    from vllm_npu.eplb.policy.metrics import imbalance, moved_slots
    from vllm_npu.eplb.policy import get_policy
    from vllm_npu.eplb.policy.validate import check_placement
    from benchmarks.eplb.workload import WorkloadConfig, generate

    slots = args.experts // ranks + redundant
    cfg = WorkloadConfig(num_layers=args.layers, num_experts=args.experts, num_ranks=ranks,
                         tokens_per_rank=tokens, preset=preset, num_windows=args.windows,
                         sub_windows=args.sub_windows, seed=args.seed)
    data = generate(cfg)
    totals = data.sum(axis=1)
    results = []
    for name in names:
        pol = get_policy(name)
        res = Result(name, ranks, redundant, slots, tokens, preset)
        prev = None
        for w in range(args.windows):
            t0 = time.perf_counter()
            plan = pol.rebalance(data[w], num_ranks=ranks, slots_per_rank=slots, old_phy2log=prev,
                                 history=totals[:w])
            res.solve_s.append(time.perf_counter() - t0)
            try:
                check_placement(plan, args.layers, args.experts, ranks, slots, name="plan")
            except ValueError:
                res.invalid += 1
                prev = None
                continue
            if w + 1 < args.windows:
                inn = imbalance(totals[w], plan, ranks, slots)
                res.inn.append(float(inn.mean()))
                res.in_max = max(res.in_max, float(inn.max()))
                res.out.append(float(imbalance(totals[w + 1], plan, ranks, slots).mean()))
            if prev is not None:
                res.moves.append(100.0 * float(moved_slots(prev, plan).sum()) / plan.size)
            prev = plan
        results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.cold_jit:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="eplb-numba-")
    from vllm_npu.eplb.policy import available_policies

    names = args.policies or available_policies()
    jit = _warm_up(names)
    print("warm-up (JIT or cache load) s: " + ", ".join(f"{k}={v:.2f}" for k, v in jit.items()),
          flush=True)
    grid = list(itertools.product(args.ranks, args.redundant, args.tokens, args.presets))
    results: list[Result] = []
    t_start = time.perf_counter()
    for i, (d, r, tok, preset) in enumerate(grid):
        pts = run_point(names, d, r, tok, preset, args)
        results.extend(pts)
        summary = "  ".join(
            f"{x.policy}: IN {sum(x.inn) / len(x.inn):.4f} OUT {sum(x.out) / len(x.out):.4f} "
            f"mv {sum(x.moves) / max(len(x.moves), 1):.1f}% "
            f"t {sum(x.solve_s) / len(x.solve_s):.3f}s" for x in pts)
        print(f"[{i + 1}/{len(grid)}] D={d} r={r} tok={tok} {preset}: {summary}", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    md = write_table(results, jit, args, time.perf_counter() - t_start)
    print(md)
    if not args.no_plot:
        write_plot(results, args.out_dir / "out_over_windows.png")
    return 1 if any(r.invalid for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
