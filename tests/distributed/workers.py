"""Processes of a test "cluster": each joins a gloo group on 127.0.0.1 and a
PyHcclCommunicator over the CPU HCCL simulator, then runs the tasks it is sent.

Kept importable without pytest: spawned children import this module by name.
"""
from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta

STOP = "__stop__"


def worker_main(rank: int, world: int, port: int, env: dict, tasks, results) -> None:
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx: dict = {"rank": rank, "world": world}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        ctx["comm"] = _make_comm()
        results.put((rank, "ok", {"pid": os.getpid()}))
    except BaseException as e:  # noqa: BLE001 - reported; the parent fails the test
        results.put((rank, "err", _describe(e)))
        return
    while True:
        name, kwargs = tasks.get()
        if name == STOP:
            break
        try:
            out = TASKS[name](ctx, **kwargs)
            results.put((rank, "ok", out))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            results.put((rank, "err", _describe(e)))
    comm = ctx.get("comm")
    if comm is not None:
        comm.destroy()
    dist.destroy_process_group()


def _make_comm():
    import torch.distributed as dist

    from vllm_npu.distributed.hccl_library import SIMULATOR_PATH
    from vllm_npu.distributed.pyhccl import PyHcclCommunicator

    return PyHcclCommunicator(dist.group.WORLD, "cpu", library_path=str(SIMULATOR_PATH))


def _describe(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e), "code": getattr(e, "code", None),
            "call": getattr(e, "call", None), "rank": getattr(e, "rank", None),
            "traceback": traceback.format_exc()}


# --- data -----------------------------------------------------------------------------------


def make_input(dtype_name: str, op: str, numel: int, seed: int, rank: int):
    """Deterministic per (seed, rank); ranges keep prod finite and ints from overflowing."""
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        if op == "prod":
            mag = torch.rand(numel, generator=g, dtype=torch.float64) + 0.5
            sign = torch.randint(0, 2, (numel,), generator=g) * 2 - 1
            x = mag * sign
        else:
            x = torch.randn(numel, generator=g, dtype=torch.float64) * 3
        return x.to(dtype)
    lo, hi = (-3, 4) if op == "prod" else (-100_000, 100_000)
    return torch.randint(lo, hi, (numel,), generator=g, dtype=torch.int64).to(dtype)


def _torch_op(op: str):
    from torch.distributed import ReduceOp

    return {"sum": ReduceOp.SUM, "prod": ReduceOp.PRODUCT, "max": ReduceOp.MAX,
            "min": ReduceOp.MIN}[op]


def _reference(parts, op: str, dtype):
    """The simulator's contract: reduce in rank order; floats accumulate in float32 (fp64 in
    float64) and round once to the dtype."""
    import torch

    acc_dtype = dtype if not dtype.is_floating_point else (
        torch.float64 if dtype == torch.float64 else torch.float32)
    acc = parts[0].to(acc_dtype)
    for p in parts[1:]:
        p = p.to(acc_dtype)
        if op == "sum":
            acc = acc + p
        elif op == "prod":
            acc = acc * p
        elif op == "max":
            acc = torch.maximum(acc, p)
        else:
            acc = torch.minimum(acc, p)
    return acc.to(dtype)


def _compare(got, gloo, ref=None, parts=None, op: str = "sum") -> dict:
    """exact_gloo / n_diff_gloo; with `ref`, exact_ref; with `parts`, norm_err: the gap to
    gloo over the rounding-error scale (sum of |inputs| for sum, |result| for prod)."""
    import torch

    out = {"exact_gloo": bool(torch.equal(got, gloo)), "numel": got.numel(),
           "n_diff_gloo": int((got != gloo).sum())}
    if ref is not None:
        out["exact_ref"] = bool(torch.equal(got, ref))
    if parts is not None and got.numel():
        diff = (got.double() - gloo.double()).abs()
        if op == "sum":
            scale = torch.stack([p.double().abs() for p in parts]).sum(0)
        else:
            scale = gloo.double().abs()
        out["norm_err"] = float((diff / scale.clamp_min(1e-300)).max())
    return out


# --- tasks ----------------------------------------------------------------------------------


def t_info(ctx) -> dict:
    comm = ctx["comm"]
    return {"pid": os.getpid(), "lib": comm.lib.path, "rank": comm.rank,
            "world": comm.world_size}


def t_all_reduce(ctx, dtype: str, op: str, numel: int, seed: int = 0) -> dict:
    import torch.distributed as dist

    rank, world, comm = ctx["rank"], ctx["world"], ctx["comm"]
    x = make_input(dtype, op, numel, seed, rank)
    x_before = x.clone()
    got = comm.all_reduce(x, op=_torch_op(op))
    assert got.data_ptr() != x.data_ptr()
    assert x.equal(x_before), "all_reduce modified its input"
    gloo = x.clone()
    dist.all_reduce(gloo, op=_torch_op(op))
    parts = [make_input(dtype, op, numel, seed, r) for r in range(world)]
    return _compare(got, gloo, _reference(parts, op, x.dtype), parts, op)


def t_all_reduce_large(ctx, mib: int) -> dict:
    import torch
    import torch.distributed as dist

    rank, comm = ctx["rank"], ctx["comm"]
    numel = mib * 1024 * 1024 // 4
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    t0 = time.perf_counter()
    got = comm.all_reduce(x)
    t_hccl = time.perf_counter() - t0
    gloo = x.clone()
    t0 = time.perf_counter()
    dist.all_reduce(gloo)
    t_gloo = time.perf_counter() - t0
    out = _compare(got, gloo)
    out.update(t_hccl=t_hccl, t_gloo=t_gloo)
    return out


def t_reduce_scatter(ctx, dtype: str, op: str, numel: int, seed: int = 0) -> dict:
    """`numel` is the per-rank output size."""
    import torch
    import torch.distributed as dist

    rank, world, comm = ctx["rank"], ctx["world"], ctx["comm"]
    x = make_input(dtype, op, numel * world, seed, rank)
    got = torch.empty(numel, dtype=x.dtype)
    comm.reduce_scatter(got, x, op=_torch_op(op))
    gloo = torch.empty_like(got)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    rs(gloo, x, op=_torch_op(op))
    parts = [make_input(dtype, op, numel * world, seed, r)[rank * numel:(rank + 1) * numel]
             for r in range(world)]
    return _compare(got, gloo, _reference(parts, op, x.dtype), parts, op)


def t_all_gather(ctx, dtype: str, numel: int, seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist

    rank, world, comm = ctx["rank"], ctx["world"], ctx["comm"]
    x = make_input(dtype, "sum", numel, seed, rank)
    got = torch.empty(numel * world, dtype=x.dtype)
    comm.all_gather(got, x)
    gloo = torch.empty_like(got)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ag(gloo, x)
    return _compare(got, gloo)


def t_broadcast(ctx, dtype: str, numel: int, src: int, seed: int = 0) -> dict:
    import torch.distributed as dist

    rank, comm = ctx["rank"], ctx["comm"]
    x = make_input(dtype, "sum", numel, seed, rank)
    gloo = x.clone()
    comm.broadcast(x, src)
    dist.broadcast(gloo, src)
    return _compare(x, gloo)


def t_all_to_all(ctx, dtype: str, numel: int, seed: int = 0, uneven: bool = False) -> dict:
    """`numel` elements per destination (rows of 3 elements when uneven)."""
    import torch
    import torch.distributed as dist

    rank, world, comm = ctx["rank"], ctx["world"], ctx["comm"]
    if not uneven:
        x = make_input(dtype, "sum", numel * world, seed, rank)
        got = torch.empty_like(x)
        comm.all_to_all(got, x)
        gloo = torch.empty_like(x)
        dist.all_to_all_single(gloo, x)
        return _compare(got, gloo)
    def rows(src: int, dst: int) -> int:
        return (numel * (src + 1) + 7 * dst) % (2 * numel + 1)

    in_splits = [rows(rank, d) for d in range(world)]
    out_splits = [rows(s, rank) for s in range(world)]
    x = make_input(dtype, "sum", sum(in_splits) * 3, seed, rank).reshape(-1, 3)
    got = torch.empty(sum(out_splits), 3, dtype=x.dtype)
    comm.all_to_all(got, x, output_split_sizes=out_splits, input_split_sizes=in_splits)
    gloo = torch.empty_like(got)
    dist.all_to_all_single(gloo, x, output_split_sizes=out_splits, input_split_sizes=in_splits)
    return _compare(got, gloo)


def t_send_recv(ctx, dtype: str, numel: int, seed: int = 0) -> dict:
    """A ring: rank r sends to r+1 and receives from r-1 (even ranks send first)."""
    import torch

    rank, world, comm = ctx["rank"], ctx["world"], ctx["comm"]
    x = make_input(dtype, "sum", numel, seed, rank)
    got = torch.empty_like(x)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        comm.send(x, nxt)
        comm.recv(got, prv)
    else:
        comm.recv(got, prv)
        comm.send(x, nxt)
    return _compare(got, make_input(dtype, "sum", numel, seed, prv))


def t_barrier(ctx, rounds: int = 10) -> dict:
    comm = ctx["comm"]
    t0 = time.perf_counter()
    for _ in range(rounds):
        comm.barrier()
    return {"seconds": time.perf_counter() - t0}


def t_non_contiguous(ctx) -> dict:
    import torch

    comm = ctx["comm"]
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # a transposed view
    seen = {}
    for name, call in (
        ("all_reduce", lambda: comm.all_reduce(x)),
        ("all_gather", lambda: comm.all_gather(torch.empty(12 * comm.world_size), x)),
        ("broadcast", lambda: comm.broadcast(x, 0)),
        ("send", lambda: comm.send(x, (comm.rank + 1) % comm.world_size)),
    ):
        try:
            call()
            seen[name] = "accepted"
        except ValueError as e:
            seen[name] = str(e)
    return seen


def t_new_comm(ctx, key: str, timeout_s: float | None = None) -> dict:
    """Another PyHcclCommunicator over the same group (HCCL_SIM_TIMEOUT_S=timeout_s)."""
    saved = os.environ.get("HCCL_SIM_TIMEOUT_S")
    if timeout_s is not None:
        os.environ["HCCL_SIM_TIMEOUT_S"] = str(timeout_s)
    try:
        ctx.setdefault("comms", {})[key] = _make_comm()
    finally:
        if saved is None:
            os.environ.pop("HCCL_SIM_TIMEOUT_S", None)
        else:
            os.environ["HCCL_SIM_TIMEOUT_S"] = saved
    return {"pid": os.getpid()}


def t_destroy_comm(ctx, key: str) -> dict:
    ctx["comms"].pop(key).destroy()
    return {}


def t_all_reduce_on(ctx, key: str, participate: bool) -> dict:
    """On communicator `key`: all_reduce if `participate`, else nothing. Reports the error."""
    import torch

    comm = ctx["comms"][key]
    if not participate:
        return {"skipped": True}
    t0 = time.perf_counter()
    try:
        comm.all_reduce(torch.ones(1000))
    except Exception as e:  # noqa: BLE001 - the test inspects it
        d = _describe(e)
        d["seconds"] = time.perf_counter() - t0
        return d
    return {"type": None, "seconds": time.perf_counter() - t0}


def t_device_communicator(ctx) -> dict:
    """The platform's NPUCommunicator (over HCCL) against gloo on the same data."""
    import torch
    import torch.distributed as dist

    from vllm_npu.distributed.communicator import NPUCommunicator

    rank, world = ctx["rank"], ctx["world"]
    comm = NPUCommunicator(dist.group.WORLD, torch.device("cpu"))
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(4, 6 * world, generator=g)
    checks = {}
    want = x.clone()
    dist.all_reduce(want)
    # float sums over 4+ ranks may round differently from gloo's order: tolerance, not bits
    checks["all_reduce"] = torch.allclose(comm.all_reduce(x.clone()), want, rtol=1e-6,
                                          atol=1e-6)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    checks["all_gather_dim1"] = torch.equal(comm.all_gather(x, dim=1), torch.cat(parts, 1))
    checks["reduce_scatter_dim1"] = torch.allclose(comm.reduce_scatter(x, dim=1),
                                                   want.chunk(world, 1)[rank], rtol=1e-6,
                                                   atol=1e-6)
    sizes = [r + 1 for r in range(world)]  # uneven: rank r holds r+1 rows
    mine = torch.full((rank + 1, 3), float(rank))
    checks["all_gatherv"] = torch.equal(
        comm.all_gatherv(mine, dim=0, sizes=sizes),
        torch.cat([torch.full((r + 1, 3), float(r)) for r in range(world)]))
    y = torch.arange(sum(sizes) * 2, dtype=torch.float32).view(-1, 2) * (rank + 1)
    total = y / (rank + 1) * sum(range(1, world + 1))
    start = sum(sizes[:rank])
    checks["reduce_scatterv"] = torch.equal(comm.reduce_scatterv(y, dim=0, sizes=sizes),
                                            total[start:start + sizes[rank]])
    # all_to_all_v (the MoE all-to-all path): rank r sends (r + j) % 3 rows to rank j.
    send = [(rank + j) % 3 for j in range(world)]
    recv = [(j + rank) % 3 for j in range(world)]
    rows_out = torch.randn(sum(send), 5, generator=g)
    want_v = torch.empty(sum(recv), 5)
    dist.all_to_all_single(want_v, rows_out, output_split_sizes=recv, input_split_sizes=send)
    checks["all_to_all_v"] = torch.equal(
        comm.all_to_all_v(torch.empty(sum(recv), 5), rows_out, recv, send), want_v)
    gathered = comm.gather(x, dst=0, dim=0)
    checks["gather"] = (gathered is None) if rank else torch.equal(gathered, torch.cat(parts))
    b = x.clone() if rank == 1 else torch.zeros_like(x)
    src_data = torch.randn(4, 6 * world, generator=torch.Generator().manual_seed(1))
    checks["broadcast"] = torch.equal(comm.broadcast(b, src=1), src_data)
    # A ring in both directions at once: every rank sends to both neighbours.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    from_prv, from_nxt = torch.empty(5), torch.empty(5)
    ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank)), nxt),
           dist.P2POp(dist.irecv, from_prv, prv),
           dist.P2POp(dist.isend, torch.full((5,), float(rank)), prv),
           dist.P2POp(dist.irecv, from_nxt, nxt)]
    if world == 2:  # the two neighbours are one peer: one exchange each way
        ops = ops[:2]
        from_nxt = from_prv
    comm.batch_isend_irecv(ops)
    checks["batch_isend_irecv"] = (torch.equal(from_prv, torch.full((5,), float(prv)))
                                   and torch.equal(from_nxt, torch.full((5,), float(nxt))))
    comm.destroy()
    return checks


def _random_placement(rng, experts: int, world: int, slots: int) -> list[int]:
    from vllm_npu.moe.expert_map import ExpertMapError, ExpertPlacement

    while True:
        extra = rng.choice(experts, world * slots - experts).tolist()
        phy2log = rng.permutation(list(range(experts)) + extra).tolist()
        try:
            return list(ExpertPlacement(experts, world, tuple(phy2log)).phy2log)
        except ExpertMapError:
            continue


def t_eplb_transfer(ctx, seed: int, fault: str = "", timeout_s: float = 30.0) -> dict:
    """One layer's experts moved by the D2D loader from one random placement to another;
    every local slot is then compared with the expert the new map names."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from vllm_npu.distributed.communicator import NPUCommunicator
    from vllm_npu.eplb.runtime.transfer import D2DExpertWeightLoader, EPGroup, plan_transfers

    rank, world = ctx["rank"], ctx["world"]
    os.environ["NPU_EPLB_FAIL_TRANSFER"] = fault
    experts, slots = 6, 3 + (world == 2)
    rng = np.random.default_rng(seed)
    old = _random_placement(rng, experts, world, slots)
    new = _random_placement(rng, experts, world, slots)

    def weight(e: int, shape, salt: int) -> torch.Tensor:
        return torch.randn(shape, generator=torch.Generator().manual_seed(100 * e + salt))

    def layer(placement):
        mine = placement[rank * slots:(rank + 1) * slots]
        return (torch.stack([weight(e, (8, 5), 1) for e in mine]),
                torch.stack([weight(e, (5, 4), 2) for e in mine]))

    weights = layer(old)
    comm = NPUCommunicator(dist.group.WORLD, torch.device("cpu"))
    try:
        group = EPGroup(dist.group.WORLD, comm, rank, world, list(range(world)), 1)
        loader = D2DExpertWeightLoader(group, weights, slots, timeout_s)
        transfers = plan_transfers(old, new, slots)
        error = loader.transfer(7, weights, transfers)
        if error is None:
            loader.commit(weights, transfers)
        moved = loader.bytes_moved(weights, transfers)
    finally:
        comm.destroy()
    want = layer(old if error else new)
    return {"error": error, "moved": moved, "changed": sum(t.dst_rank == rank for t in transfers),
            "consistent": all(torch.equal(w, x) for w, x in zip(weights, want))}


TASKS = {
    "eplb_transfer": t_eplb_transfer,
    "device_communicator": t_device_communicator,
    "info": t_info,
    "all_reduce": t_all_reduce,
    "all_reduce_large": t_all_reduce_large,
    "reduce_scatter": t_reduce_scatter,
    "all_gather": t_all_gather,
    "broadcast": t_broadcast,
    "all_to_all": t_all_to_all,
    "send_recv": t_send_recv,
    "barrier": t_barrier,
    "non_contiguous": t_non_contiguous,
    "new_comm": t_new_comm,
    "destroy_comm": t_destroy_comm,
    "all_reduce_on": t_all_reduce_on,
}
