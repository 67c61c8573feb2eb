"""The HCCL simulator's host rule (csrc/hccl_sim_hosts.c): ranks on other hosts (network
namespaces here) must reach the root rank's HCCL address, as a device's HcclCommInitRootInfo
connects there over TCP; ranks on another machine are refused outright."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ray_nodes import Hosts, netns_available
from vllm_npu.distributed.hccl_library import (
    HCCL_E_NOT_SUPPORT,
    HCCL_E_TCP_CONNECT,
    HcclError,
    HcclLibrary,
)

REPO = str(Path(__file__).resolve().parents[2])
needs_netns = pytest.mark.skipif(not netns_available(), reason="needs root + network namespaces")

# One rank of a 2-rank communicator: reads the root info (hex) from a file, or writes it when
# it is rank 0; all-reduces [rank + 1] * 4 and prints the result or the error as JSON.
RANK = r'''
import json, os, sys, time, torch
from vllm_npu.distributed.hccl_library import HcclLibrary, HcclRootInfo, HcclError, HcclDataTypeEnum
lib_path, rank, root_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lib = HcclLibrary(lib_path)
try:
    if rank == 0:
        root = lib.HcclGetRootInfo()
        open(root_file + ".tmp", "w").write(bytes(root).hex())
        os.rename(root_file + ".tmp", root_file)
    else:
        while not os.path.exists(root_file):
            time.sleep(0.05)
        root = HcclRootInfo.from_buffer_copy(bytes.fromhex(open(root_file).read()))
    comm = lib.HcclCommInitRootInfo(2, root, rank)
    x = torch.full((4,), float(rank + 1))
    lib.HcclAllReduce(x.data_ptr(), x.data_ptr(), 4, HcclDataTypeEnum.FP32, 0, comm, None, rank)
    lib.HcclCommDestroy(comm)
    print(json.dumps({"sum": x.tolist()}))
except HcclError as e:
    print(json.dumps({"code": e.code, "error": str(e)}))
'''


def _rank_line(sim_library: str, rank: int, root_file: Path) -> str:
    return (f"cd {REPO} && {sys.executable} -c '{RANK}' {sim_library} {rank} {root_file}")


def _result(proc_out: str) -> dict:
    return json.loads(proc_out.strip().splitlines()[-1])


@needs_netns
def test_ranks_on_two_linked_hosts_all_reduce(sim_library, tmp_path):
    """Rank 0 on host A (HCCL_IF_IP = its veth address), rank 1 on host B: B reaches A, the
    all-reduce runs (through the machine's shared memory, as the simulator does)."""
    with Hosts(2) as hosts:
        a, b = hosts.nodes
        root = tmp_path / "root"
        procs = [node.start(_rank_line(sim_library, rank, root), tmp_path / f"r{rank}.log")
                 for rank, node in enumerate((a, b))]
        for p in procs:
            p.wait(timeout=120)
        out = [_result((tmp_path / f"r{r}.log").read_text()) for r in (0, 1)]
        root_hex = root.read_text()
    assert out == [{"sum": [3.0] * 4}] * 2
    assert bytes.fromhex(root_hex).find(a.ip.encode()) > 0  # the root's address travels


@needs_netns
def test_rank_that_cannot_reach_the_root_is_refused(sim_library, tmp_path, monkeypatch):
    """Rank 1 in a network namespace with nothing but loopback cannot reach rank 0's
    address: HCCL_E_TCP_CONNECT naming it, at once (not after the group timeout)."""
    monkeypatch.setenv("HCCL_SIM_TIMEOUT_S", "5")
    lib = HcclLibrary(sim_library)
    root = lib.HcclGetRootInfo()
    root_file = tmp_path / "root"
    root_file.write_text(bytes(root).hex())
    res = subprocess.run(["unshare", "--net", "bash", "-c", "ip link set lo up && "
                          + _rank_line(sim_library, 1, root_file)],
                         capture_output=True, text=True, timeout=120)
    out = _result(res.stdout)
    assert out["code"] == HCCL_E_TCP_CONNECT, out
    assert "another host" in out["error"] and "cannot reach its HCCL address" in out["error"]
    assert "HCCL_IF_IP" in out["error"]


def test_rank_on_another_machine_is_refused(sim_library):
    """A root info whose boot id is another machine's: HCCL_E_NOT_SUPPORT, the simulator has
    no transport between machines."""
    lib = HcclLibrary(sim_library)
    raw = bytearray(bytes(lib.HcclGetRootInfo()))
    mine = Path("/proc/sys/kernel/random/boot_id").read_text().strip().encode()
    at = raw.find(mine)
    assert at > 0, "the root info carries the machine's boot id"
    raw[at:at + len(mine)] = b"0" * len(mine)
    from vllm_npu.distributed.hccl_library import HcclRootInfo

    with pytest.raises(HcclError) as info:
        lib.HcclCommInitRootInfo(2, HcclRootInfo.from_buffer_copy(bytes(raw)), 1)
    assert info.value.code == HCCL_E_NOT_SUPPORT
    assert "another machine" in str(info.value)


def test_root_without_an_address_is_refused(sim_library, monkeypatch):
    monkeypatch.setenv("HCCL_IF_IP", "not-an-ip")
    with pytest.raises(HcclError, match="HCCL_IF_IP gives no IPv4 address"):
        HcclLibrary(sim_library).HcclGetRootInfo()
    monkeypatch.delenv("HCCL_IF_IP")
    monkeypatch.setenv("HCCL_SOCKET_IFNAME", "no-such-nic0")
    with pytest.raises(HcclError, match="HCCL_SOCKET_IFNAME gives no IPv4 address"):
        HcclLibrary(sim_library).HcclGetRootInfo()
    assert os.environ.get("HCCL_IF_IP") is None
