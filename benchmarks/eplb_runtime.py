"""The EPLB runtime on the simulated NPU: what load recording costs per step, how long a
layer's expert migration takes for the bytes it moves (EP=4), and the balancedness a
rebalance buys under a skewed router.

    .venv/bin/python benchmarks/eplb_runtime.py [--world 4 --hidden 1024 --experts 64]

1. Recording: host ops (entries of a captured simulated graph) and time of the per-layer
   counter (`count_pairs`, inside the MoE forward) and of the per-step window update
   (`LoadRecorder.record`, all layers at once). No host sync in either.
2. Migration: `--world` processes (gloo on 127.0.0.1 + NPUCommunicator over the HCCL
   simulator), one layer moved by the D2DExpertWeightLoader (transfer + commit) from a
   random placement to 2 or 8 cross-rank swaps of it, or to another random placement;
   time = slowest rank, median of 3.
3. Balancedness (vLLM's mean/max EP-rank load, summed over layers) of the starting
   placement (linear + replicas) and of each policy's plan, both measured on the window
   *after* the one the plan was made from (plan ms: the policy alone, compiled).
   Workloads: benchmarks.eplb.workload presets at seeds 100+ (the policies' defaults were
   chosen on seeds 0-9).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from timing import median_ms  # benchmarks/ is the script's path entry

ROOT = Path(__file__).resolve().parents[1]


def recording_table(args) -> list[str]:
    from types import SimpleNamespace

    from vllm_npu.eplb.runtime.recorder import LoadRecorder
    from vllm_npu.moe.expert_map import count_pairs
    from vllm_npu.moe.expert_map import ExpertPlacement
    from vllm_npu.ops.sim.graph import SimGraph

    rows = ["| what | size | host ops | us |", "|---|---|---:|---:|"]
    physical = args.experts + args.redundant
    for tokens in (1, 64, 1024):
        load = torch.zeros(physical, dtype=torch.int64)
        slots = torch.randint(0, physical, (tokens, args.top_k), dtype=torch.int32)
        graph = SimGraph()
        graph.capture_begin()
        count_pairs(load, slots)
        graph.capture_end()
        us = median_ms(lambda: count_pairs(load, slots), args.repeats, warmup=2) * 1e3
        rows.append(f"| counter, per MoE layer and step | {tokens} tokens x k={args.top_k} "
                    f"| {len(graph.entries)} | {us:.1f} |")
    placement = ExpertPlacement.spread(args.experts, args.world, args.redundant)
    for layers in (4, 58):
        views = [SimpleNamespace(placement=placement, layer_id=i,
                                 method=SimpleNamespace(expert_load=torch.zeros(
                                     physical, dtype=torch.int64)))
                 for i in range(layers)]
        for v in views:
            v.load = v.method.expert_load
        rec = LoadRecorder(views, window_size=args.window)
        graph = SimGraph()
        graph.capture_begin()
        rec.record()
        graph.capture_end()
        us = median_ms(rec.record, args.repeats, warmup=2) * 1e3
        rows.append(f"| window update, per step | {layers} layers x {physical} slots, "
                    f"window {args.window} | {len(graph.entries)} | {us:.1f} |")
    return rows


# ---- migration (one process per EP rank) -----------------------------------------------
def _placements(rng, experts: int, world: int, slots: int):
    from vllm_npu.moe.expert_map import ExpertMapError, ExpertPlacement

    while True:
        extra = rng.choice(experts, world * slots - experts).tolist()
        try:
            return ExpertPlacement(experts, world, tuple(
                int(e) for e in rng.permutation(list(range(experts)) + extra)))
        except ExpertMapError:
            continue


def _swapped(rng, old, swaps: int):
    """`old` with `swaps` cross-rank exchanges of two slots' experts (still valid)."""
    from vllm_npu.moe.expert_map import ExpertMapError, ExpertPlacement

    phy2log, done = list(old.phy2log), 0
    while done < swaps:
        a, b = rng.choice(len(phy2log), 2, replace=False)
        trial = list(phy2log)
        trial[a], trial[b] = trial[b], trial[a]
        try:
            ExpertPlacement(old.num_experts, old.ep_size, tuple(trial))
        except ExpertMapError:
            continue
        if trial != phy2log:
            phy2log, done = trial, done + 1
    return ExpertPlacement(old.num_experts, old.ep_size, tuple(phy2log))


def _migrate_worker(rank: int, world: int, port: int, args, out) -> None:
    os.environ["NPU_PLUGIN_SIMULATE"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from vllm_npu.distributed.communicator import NPUCommunicator
    from vllm_npu.eplb.runtime.transfer import D2DExpertWeightLoader, EPGroup, plan_transfers

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    comm = NPUCommunicator(dist.group.WORLD, torch.device("cpu"))
    group = EPGroup(dist.group.WORLD, comm, rank, world, list(range(world)), 1)
    slots = (args.experts + args.redundant) // world
    rng = np.random.default_rng(args.seed)  # same placements on every rank
    for hidden, swaps in ((h, k) for h in args.hidden for k in (2, 8, None)):
        inter = hidden // 2
        w13 = torch.randn(slots, 2 * inter, hidden)
        w2 = torch.randn(slots, hidden, inter)
        loader = D2DExpertWeightLoader(group, (w13, w2), slots, timeout_s=600)
        old = _placements(rng, args.experts, world, slots)
        new = _placements(rng, args.experts, world, slots) if swaps is None else \
            _swapped(rng, old, swaps)
        transfers = plan_transfers(old.phy2log, new.phy2log, slots)
        times = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            assert loader.transfer(0, (w13, w2), transfers) is None
            loader.commit((w13, w2), transfers)
            spent = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(spent, op=dist.ReduceOp.MAX)
            times.append(float(spent))
        moved = torch.tensor([loader.bytes_moved((w13, w2), transfers)])
        dist.all_reduce(moved)
        if rank == 0:
            remote = sum(not t.local for t in transfers)
            out.put((hidden, inter, len(transfers), remote, int(moved),
                     statistics.median(times)))
    comm.destroy()
    dist.destroy_process_group()


def migration_table(args) -> list[str]:
    from vllm_npu.disagg.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_migrate_worker, args=(r, args.world, port, args, out))
             for r in range(args.world)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in range(3 * len(args.hidden))]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"migration worker exited with {p.exitcode}")
    rows = ["| H | I | MiB per expert | slots changed | from other ranks | MiB moved "
            "| ms per layer | GB/s |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for hidden, inter, changed, remote, moved, seconds in results:
        per = 3 * hidden * inter * 4 / 2**20
        rows.append(f"| {hidden} | {inter} | {per:.2f} | {changed} | {remote} | "
                    f"{moved / 2**20:.1f} | {seconds * 1e3:.1f} | {moved / seconds / 1e9:.2f} |")
    return rows


# ---- balancedness ------------------------------------------------------------------------
def balance_table(args) -> list[str]:
    from vllm_npu.eplb.policy import get_policy
    from vllm_npu.eplb.runtime.updator import balancedness
    from benchmarks.eplb.workload import WorkloadConfig, generate
    from vllm_npu.moe.expert_map import ExpertPlacement

    slots = (args.experts + args.redundant) // args.world
    start = np.array([ExpertPlacement.spread(args.experts, args.world,
                                             args.redundant).phy2log] * args.layers)
    rows = ["| workload | seed | policy | start placement | rebalanced | plan ms |",
            "|---|---:|---|---:|---:|---:|"]
    for name in args.policies:  # numba compiles on the first call: not part of a plan
        get_policy(name).rebalance(np.ones((1, args.experts)), args.world, slots)
    for preset in ("stable", "shifting"):
        for seed in args.eval_seeds:
            windows = generate(WorkloadConfig(
                num_layers=args.layers, num_experts=args.experts, top_k=args.top_k,
                num_ranks=args.world, preset=preset, num_windows=2, seed=seed))
            plan_on, judge_on = windows[0].sum(axis=0), windows[1].sum(axis=0)
            for name in args.policies:
                t0 = time.perf_counter()
                plan = get_policy(name).rebalance(plan_on, args.world, slots, start)
                ms = (time.perf_counter() - t0) * 1e3
                rows.append(f"| {preset} | {seed} | {name} | "
                            f"{balancedness(judge_on, start, args.world):.3f} | "
                            f"{balancedness(judge_on, plan, args.world):.3f} | {ms:.0f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--redundant", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--policies", nargs="+", default=["default", "flashlb"])
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    print(f"## Load recording (E={args.experts}+{args.redundant} redundant, simulated NPU, "
          "1 thread)\n")
    print("\n".join(recording_table(args)))
    print(f"\n## Migration of one MoE layer, EP={args.world} (HCCL simulator, float32)\n")
    print("\n".join(migration_table(args)))
    print(f"\n## Balancedness on the next window, EP={args.world}, {args.layers} layers, "
          f"E={args.experts}+{args.redundant}, top-{args.top_k}\n")
    print("\n".join(balance_table(args)))


if __name__ == "__main__":
    main()
