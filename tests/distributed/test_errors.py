"""Error mapping, timeouts on missing or dead peers, shared-memory cleanup, library lookup."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.distributed import ReduceOp

from tests.distributed.conftest import shm_names
from vllm_npu.distributed import hccl_library as hl
from vllm_npu.distributed.hccl_library import (
    HCCL_E_NOT_SUPPORT,
    HCCL_E_PARA,
    HCCL_E_TIMEOUT,
    HcclDataTypeEnum,
    HcclError,
    HcclLibrary,
    HcclLibraryNotFound,
    HcclReduceOpEnum,
)


@pytest.fixture(scope="module")
def lib(sim_library) -> HcclLibrary:
    return HcclLibrary(sim_library)


def test_enums_follow_cann():
    assert ctypes.sizeof(hl.HcclRootInfo) == 4108
    assert [HcclDataTypeEnum.from_torch(d) for d in
            (torch.int8, torch.int16, torch.int32, torch.float16, torch.float32, torch.int64,
             torch.uint8, torch.float64, torch.bfloat16)] == [0, 1, 2, 3, 4, 5, 7, 10, 11]
    assert [HcclReduceOpEnum.from_torch(o) for o in
            (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="does not support dtype"):
        HcclDataTypeEnum.from_torch(torch.complex64)
    with pytest.raises(ValueError, match="does not support reduce op"):
        HcclReduceOpEnum.from_torch(ReduceOp.AVG)
    assert hl.HCCL_RESULT_NAMES[9] == "HCCL_E_TIMEOUT" and hl.HCCL_RESULT_NAMES[1] == "HCCL_E_PARA"


def test_error_strings(lib):
    assert lib.HcclGetErrorString(0) == "success"
    assert lib.HcclGetErrorString(HCCL_E_PARA) == "parameter error"
    assert lib.HcclGetErrorString(HCCL_E_TIMEOUT) == "timeout"
    assert lib.HcclGetErrorString(999) == "unknown HcclResult"


@pytest.mark.parametrize("nranks, rank", [(2, 5), (2, 2), (0, 0), (65, 0)])
def test_bad_rank_or_nranks(lib, nranks, rank):
    root = lib.HcclGetRootInfo()
    with pytest.raises(HcclError) as info:
        lib.HcclCommInitRootInfo(nranks, root, rank)
    e = info.value
    assert (e.code, e.name, e.call, e.rank) == (HCCL_E_PARA, "HCCL_E_PARA",
                                                "HcclCommInitRootInfo", rank)
    msg = str(e)
    for part in ("HcclCommInitRootInfo", f"rank {rank}", "HcclResult 1", "HCCL_E_PARA",
                 "parameter error"):
        assert part in msg, (part, msg)


def test_foreign_root_info_refused(lib):
    with pytest.raises(HcclError, match="HCCL_E_PARA.*root info"):
        lib.HcclCommInitRootInfo(1, hl.HcclRootInfo(), 0)


def test_single_rank_comm_errors(lib):
    """A 1-rank communicator in this process: bad dtype / op / root map to their codes."""
    comm = lib.HcclCommInitRootInfo(1, lib.HcclGetRootInfo(), 0)
    try:
        x = torch.arange(5, dtype=torch.float32)
        y = torch.empty_like(x)
        lib.HcclAllReduce(x.data_ptr(), y.data_ptr(), 5, HcclDataTypeEnum.FP32, 0, comm, None, 0)
        assert torch.equal(x, y)
        assert lib.HcclGetRankSize(comm) == 1 and lib.HcclGetRankId(comm) == 0
        with pytest.raises(HcclError) as info:
            lib.HcclAllReduce(x.data_ptr(), y.data_ptr(), 5, HcclDataTypeEnum.INT128, 0, comm,
                              None, 0)
        assert info.value.code == HCCL_E_NOT_SUPPORT and info.value.call == "HcclAllReduce"
        with pytest.raises(HcclError) as info:
            lib.HcclAllReduce(x.data_ptr(), y.data_ptr(), 5, HcclDataTypeEnum.FP32, 9, comm,
                              None, 0)
        assert info.value.code == HCCL_E_PARA
        with pytest.raises(HcclError, match="HcclBroadcast failed on rank 0.*root 3"):
            lib.HcclBroadcast(x.data_ptr(), 5, HcclDataTypeEnum.FP32, 3, comm, None, 0)
        with pytest.raises(HcclError, match="HcclSend.*itself"):
            lib.HcclSend(x.data_ptr(), 5, HcclDataTypeEnum.FP32, 0, comm, None, 0)
    finally:
        lib.HcclCommDestroy(comm)


def test_init_timeout_removes_shm(lib, monkeypatch):
    """Rank 1 never joins: rank 0's init fails with HCCL_E_TIMEOUT and unlinks the segment."""
    monkeypatch.setenv("HCCL_SIM_TIMEOUT_S", "0.5")
    root = lib.HcclGetRootInfo()
    t0 = time.monotonic()
    with pytest.raises(HcclError) as info:
        lib.HcclCommInitRootInfo(2, root, 0)
    assert time.monotonic() - t0 < 5
    assert info.value.code == HCCL_E_TIMEOUT and "waiting for rank 1" in str(info.value)
    assert shm_names(os.getpid()) == []


def test_timeout_aborts_the_group(lib, monkeypatch):
    """Rank 0 times out waiting for rank 1; rank 1, arriving later, fails at once."""
    monkeypatch.setenv("HCCL_SIM_TIMEOUT_S", "1")
    root = lib.HcclGetRootInfo()
    comms: dict = {}
    outcome: dict = {}

    def rank_main(rank: int) -> None:
        comms[rank] = lib.HcclCommInitRootInfo(2, root, rank)
        if rank == 1:
            time.sleep(2.5)
        x = torch.ones(100)
        t0 = time.monotonic()
        try:
            lib.HcclAllReduce(x.data_ptr(), x.data_ptr(), 100, HcclDataTypeEnum.FP32, 0,
                              comms[rank], None, rank)
            outcome[rank] = (None, time.monotonic() - t0)
        except HcclError as e:
            outcome[rank] = (e, time.monotonic() - t0)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for c in comms.values():
        lib.HcclCommDestroy(c)
    e0, s0 = outcome[0]
    e1, s1 = outcome[1]
    assert e0 is not None and e0.code == HCCL_E_TIMEOUT and 0.9 < s0 < 5, outcome
    assert "waiting for rank 1" in str(e0)
    assert e1 is not None and e1.code == HCCL_E_TIMEOUT and s1 < 0.8, outcome
    assert "aborted because rank 0 timed out" in str(e1)
    assert shm_names(os.getpid()) == []


def test_peer_never_calls(cluster2):
    """2-rank PyHcclCommunicator, rank 1 skips the all_reduce: rank 0 gets HCCL_E_TIMEOUT
    after HCCL_SIM_TIMEOUT_S=2, naming the call and the rank."""
    pid0 = cluster2.pids[0]
    cluster2.run("new_comm", key="late", timeout_s=2)
    assert shm_names(pid0) == []  # unlinked as soon as both ranks attached
    r0, r1 = cluster2.run("all_reduce_on", per_rank=[{"key": "late", "participate": True},
                                                     {"key": "late", "participate": False}])
    assert r1 == {"skipped": True}
    assert r0["type"] == "HcclError" and r0["code"] == HCCL_E_TIMEOUT, r0
    assert r0["call"] == "HcclAllReduce" and r0["rank"] == 0
    for part in ("HcclAllReduce failed on rank 0", "HCCL_E_TIMEOUT", "waiting for rank 1"):
        assert part in r0["message"], r0["message"]
    assert 1.5 < r0["seconds"] < 10
    cluster2.run("destroy_comm", key="late")
    assert shm_names(pid0) == []
    # the cluster's own communicator is unaffected
    for res in cluster2.run("all_reduce", dtype="float32", op="sum", numel=10):
        assert res["exact_gloo"]


_PEER = r"""
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
root = ctypes.create_string_buffer(bytes.fromhex(sys.stdin.readline().strip()), 4108)
comm = ctypes.c_void_p()
rc = lib.HcclCommInitRootInfo(ctypes.c_uint32(2), root, ctypes.c_uint32(1), ctypes.byref(comm))
print(rc, flush=True)
time.sleep(120)
"""


def test_killed_peer(lib, sim_library, monkeypatch):
    """Rank 1 (another process) is SIGKILLed after joining: rank 0's all_reduce gets
    HCCL_E_TIMEOUT within HCCL_SIM_TIMEOUT_S, and no shared memory stays behind."""
    monkeypatch.setenv("HCCL_SIM_TIMEOUT_S", "2")
    root = lib.HcclGetRootInfo()
    peer = subprocess.Popen([sys.executable, "-c", _PEER, sim_library], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        peer.stdin.write(bytes(root.internal).hex() + "\n")
        peer.stdin.flush()
        comm = lib.HcclCommInitRootInfo(2, root, 0)
        assert peer.stdout.readline().strip() == "0"
        peer.kill()
        peer.wait(timeout=10)
        assert shm_names(os.getpid()) == []
        x = torch.ones(4096)
        t0 = time.monotonic()
        with pytest.raises(HcclError) as info:
            lib.HcclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), HcclDataTypeEnum.FP32, 0,
                              comm, None, 0)
        assert 1.5 < time.monotonic() - t0 < 10
        assert info.value.code == HCCL_E_TIMEOUT and info.value.rank == 0
        # a broken communicator refuses further work instead of hanging
        with pytest.raises(HcclError, match="HCCL_E_UNAVAIL"):
            lib.HcclBarrier(comm, None, 0)
        lib.HcclCommDestroy(comm, 0)
        assert shm_names(os.getpid()) == []
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait(timeout=10)


def test_missing_library_names_build_command(monkeypatch, tmp_path):
    monkeypatch.delenv("HCCL_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(hl, "SIMULATOR_PATH", tmp_path / "libhccl_sim.so")
    with pytest.raises(HcclLibraryNotFound, match="installed without a C compiler. Install "
                                                  "gcc and reinstall vllm_npu"):
        hl.find_hccl_library(simulated=True)
    monkeypatch.setenv("HCCL_LIBRARY_PATH", str(tmp_path / "nope.so"))
    with pytest.raises(HcclLibraryNotFound, match="HCCL_LIBRARY_PATH"):
        hl.find_hccl_library(simulated=True)


def test_library_lookup(monkeypatch, sim_library):
    monkeypatch.setenv("HCCL_LIBRARY_PATH", sim_library)
    assert hl.find_hccl_library(simulated=False) == (sim_library, "env")
    monkeypatch.delenv("HCCL_LIBRARY_PATH")
    assert hl.find_hccl_library(simulated=True) == (sim_library, "simulator")
    monkeypatch.setenv("ASCEND_HOME_PATH", "/nonexistent")
    if not os.path.exists("/usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so"):
        with pytest.raises(HcclLibraryNotFound, match="libhccl.so not found"):
            hl.find_hccl_library(simulated=False)
