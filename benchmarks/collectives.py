"""All-reduce and all-gather bandwidth: the CPU HCCL simulator (PyHcclCommunicator) vs gloo.

Spawns `--world` processes on this host (gloo rendezvous on 127.0.0.1), times each
collective for message sizes 1 KiB ... `--max-mib` MiB and prints a markdown table with
the nccl-tests conventions:

    algbw = size / time
    all-reduce  busbw = algbw * 2(n-1)/n      (size = the buffer reduced)
    all-gather  busbw = algbw * (n-1)/n       (size = the gathered output)

The time of an iteration is the slowest rank's. Needs the HCCL simulator, which
`make install` / `pip install` build.

    python benchmarks/collectives.py [--world 2] [--max-mib 64] [--seconds 0.3]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _time_op(fn, barrier, seconds: float, max_iters: int = 1000) -> float:
    """Mean seconds per call: warm up, then as many calls as fit in `seconds` (>= 3)."""
    import torch
    import torch.distributed as dist

    fn()
    barrier()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    # every rank must run the same number of iterations: agree on the slowest estimate
    est = torch.tensor([one])
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = int(min(max_iters, max(3, seconds / max(float(est), 1e-7))))
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mean = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean)


def _worker(rank: int, world: int, port: int, sizes: list[int], seconds: float, out) -> None:
    os.environ.setdefault("NPU_PLUGIN_SIMULATE", "1")
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    from vllm_npu.distributed.pyhccl import PyHcclCommunicator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    comm = PyHcclCommunicator(dist.group.WORLD, "cpu")
    gloo_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rows = []
    for size in sizes:
        numel = size // 4
        x = torch.randn(numel)
        y = torch.empty_like(x)
        ar_sim = _time_op(lambda x=x, y=y: comm.all_reduce(x, y), comm.barrier, seconds)
        ar_gloo = _time_op(lambda y=y: dist.all_reduce(y), dist.barrier, seconds)
        part = torch.randn(numel // world)
        gathered = torch.empty(part.numel() * world)
        ag_sim = _time_op(lambda g=gathered, p=part: comm.all_gather(g, p), comm.barrier,
                          seconds)
        ag_gloo = _time_op(lambda g=gathered, p=part: gloo_all_gather(g, p), dist.barrier,
                           seconds)
        rows.append((size, ar_sim, ar_gloo, ag_sim, ag_gloo))
    if rank == 0:
        out.put(rows)
    comm.destroy()
    dist.destroy_process_group()


def _fmt_size(b: int) -> str:
    return f"{b // 1048576} MiB" if b >= 1048576 else f"{b // 1024} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--min-kib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=0.3, help="timed seconds per cell")
    args = ap.parse_args()

    sizes = []
    size = args.min_kib * 1024
    while size <= args.max_mib * 1048576:
        sizes.append(size)
        size *= 4
    from vllm_npu.disagg.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, args.world, port, sizes, args.seconds, out))
             for r in range(args.world)]
    for p in procs:
        p.start()
    rows = out.get()
    for p in procs:
        p.join()

    n = args.world
    ar_f, ag_f = 2 * (n - 1) / n, (n - 1) / n
    print(f"## Collectives on {n} processes: CPU HCCL simulator vs gloo (busbw, GB/s)\n")
    print("| size | all-reduce sim µs | busbw sim | all-reduce gloo µs | busbw gloo | "
          "all-gather sim µs | busbw sim | all-gather gloo µs | busbw gloo |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, ar_sim, ar_gloo, ag_sim, ag_gloo in rows:
        def bw(t: float, f: float, size: int = size) -> float:
            return size / t * f / 1e9

        print(f"| {_fmt_size(size)} | {ar_sim * 1e6:.1f} | {bw(ar_sim, ar_f):.2f} | "
              f"{ar_gloo * 1e6:.1f} | {bw(ar_gloo, ar_f):.2f} | {ag_sim * 1e6:.1f} | "
              f"{bw(ag_sim, ag_f):.2f} | {ag_gloo * 1e6:.1f} | {bw(ag_gloo, ag_f):.2f} |")


if __name__ == "__main__":
    main()
