"""Every PyHcclCommunicator collective on the CPU HCCL simulator vs torch.distributed/gloo,
on 2 and 4 processes.

Exactness: the simulator reduces in rank order, accumulating floats in float32 and rounding
once, and every result is checked bit-exact against that reference. Against gloo it is
bit-exact wherever gloo's result does not depend on its internal order: 2 ranks (one
rounding of a+b), max/min, integers, and every data-movement collective. For float sum/prod
on 4 ranks gloo adds in another order, so only a rounding-level gap is allowed there.
"""
from __future__ import annotations

import pytest
import torch

DTYPES = ["float32", "bfloat16", "float16", "int32"]
OPS = ["sum", "prod", "max", "min"]
# 100_003 elements span several chunks of the 1 MiB staging buffer the clusters use
SIZES = [1, 7, 100_003]


def _check_reduction(results: list[dict], world: int, dtype: str, op: str) -> None:
    for rank, res in enumerate(results):
        assert res["exact_ref"], f"rank {rank}: not the rank-order reference: {res}"
        if world == 2 or op in ("max", "min") or dtype == "int32":
            assert res["exact_gloo"], f"rank {rank}: differs from gloo: {res}"
        else:
            eps = torch.finfo(getattr(torch, dtype)).eps
            assert res["norm_err"] <= world * eps, f"rank {rank}: far from gloo: {res}"


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(cluster, dtype, op, numel):
    if (dtype, op) == ("bfloat16", "prod"):  # hccl API reference: prod takes no bfp16
        with pytest.raises(AssertionError, match="prod does not support data type 11"):
            cluster.run("all_reduce", dtype=dtype, op=op, numel=numel, seed=numel)
        return
    results = cluster.run("all_reduce", dtype=dtype, op=op, numel=numel, seed=numel)
    _check_reduction(results, cluster.world, dtype, op)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(cluster, dtype, op, numel):
    if (dtype, op) == ("bfloat16", "prod"):
        with pytest.raises(AssertionError, match="prod does not support data type 11"):
            cluster.run("reduce_scatter", dtype=dtype, op=op, numel=numel, seed=numel + 1)
        return
    results = cluster.run("reduce_scatter", dtype=dtype, op=op, numel=numel, seed=numel + 1)
    _check_reduction(results, cluster.world, dtype, op)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(cluster, dtype, numel):
    for res in cluster.run("all_gather", dtype=dtype, numel=numel, seed=numel):
        assert res["exact_gloo"], res


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(cluster, dtype, numel):
    for src in (0, cluster.world - 1):
        for res in cluster.run("broadcast", dtype=dtype, numel=numel, src=src, seed=numel):
            assert res["exact_gloo"], res


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all(cluster, dtype, numel):
    for res in cluster.run("all_to_all", dtype=dtype, numel=numel, seed=numel):
        assert res["exact_gloo"], res


@pytest.mark.parametrize("rows", [1, 5, 20_001])
def test_all_to_all_uneven(cluster, rows):
    """HcclAlltoAllV: different row counts per (source, destination), some of them zero."""
    for res in cluster.run("all_to_all", dtype="float32", numel=rows, seed=rows, uneven=True):
        assert res["exact_gloo"], res


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_send_recv(cluster, dtype, numel):
    for res in cluster.run("send_recv", dtype=dtype, numel=numel, seed=numel):
        assert res["exact_gloo"], res


def test_barrier(cluster):
    for res in cluster.run("barrier", rounds=50):
        assert res["seconds"] < 5


def test_non_contiguous_refused(cluster):
    for res in cluster.run("non_contiguous"):
        for call, outcome in res.items():
            assert "must be contiguous" in outcome, (call, outcome)


def test_all_reduce_64mib(cluster2):
    """One large case: 64 MiB of fp32 summed, through a 1 MiB staging buffer."""
    for res in cluster2.run("all_reduce_large", mib=64, timeout=120):
        assert res["exact_gloo"], res


def test_device_communicator_matches_gloo(cluster):
    """NPUCommunicator (the platform's device communicator) on the HCCL binding."""
    for res in cluster.run("device_communicator", timeout=120):
        assert res and all(res.values()), res
