"""ctypes binding of HCCL (CANN's libhccl.so), in the style of vLLM's pynccl_wrapper.

One table (`HcclLibrary.exported_functions`) names every C function used with its
result and argument types, taken from CANN's ``hccl.h`` / ``hccl_types.h``; the enums
below carry CANN's numeric values. The same binding drives either

  * the real library: ``HCCL_LIBRARY_PATH`` if set, else CANN's install
    (``$ASCEND_HOME_PATH/lib64/libhccl.so``, ``/usr/local/Ascend/ascend-toolkit/latest/
    lib64/libhccl.so``), on an NPU host; or
  * the CPU simulator built from ``csrc/`` (``libhccl_sim.so`` next to this file) on the
    simulated NPU (``vllm_npu.device.select_backend().simulated``), where the buffers are
    host memory and the stream argument is ignored.

Every non-zero ``HcclResult`` raises `HcclError`, naming the code, its name, the library's
own string for it (``HcclGetErrorString``), the call and the rank.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.distributed import ReduceOp

from vllm_npu.envs import HCCL_LIBRARY_PATH, HCCL_SIM_BUFFER_MB, HCCL_SIM_TIMEOUT_S

logger = logging.getLogger("vllm.npu")  # under "vllm": uses vLLM's log handlers


ALL_ENV = (HCCL_LIBRARY_PATH, HCCL_SIM_TIMEOUT_S, HCCL_SIM_BUFFER_MB)

REPO_ROOT = Path(__file__).resolve().parents[2]
SIMULATOR_PATH = Path(__file__).resolve().with_name("libhccl_sim.so")
SIMULATOR_SOURCES = tuple(REPO_ROOT / "csrc" / name for name in (
    "hccl_sim.c", "hccl_sim.h", "hccl_sim_hosts.c", "hccl_sim_hosts.h"))
# setup.py builds the library into the package (wheel, sdist, editable install alike)
BUILD_COMMAND = "pip install -e . (or make install) in a checkout"

# === types of hccl_types.h ==================================================================

HcclResult_t = ctypes.c_int
HcclComm_t = ctypes.c_void_p
aclrtStream_t = ctypes.c_void_p
buffer_type = ctypes.c_void_p
HcclDataType_t = ctypes.c_int
HcclReduceOp_t = ctypes.c_int

HCCL_ROOT_INFO_BYTES = 4108


class HcclRootInfo(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * HCCL_ROOT_INFO_BYTES)]


assert ctypes.sizeof(HcclRootInfo) == HCCL_ROOT_INFO_BYTES

# HcclResult: code -> name.
HCCL_RESULT_NAMES: dict[int, str] = {
    0: "HCCL_SUCCESS",
    1: "HCCL_E_PARA",
    2: "HCCL_E_PTR",
    3: "HCCL_E_MEMORY",
    4: "HCCL_E_INTERNAL",
    5: "HCCL_E_NOT_SUPPORT",
    6: "HCCL_E_NOT_FOUND",
    7: "HCCL_E_UNAVAIL",
    8: "HCCL_E_SYSCALL",
    9: "HCCL_E_TIMEOUT",
    10: "HCCL_E_OPEN_FILE_FAILURE",
    11: "HCCL_E_TCP_CONNECT",
    12: "HCCL_E_ROCE_CONNECT",
    13: "HCCL_E_TCP_TRANSFER",
    14: "HCCL_E_ROCE_TRANSFER",
    15: "HCCL_E_RUNTIME",
    16: "HCCL_E_DRV",
    17: "HCCL_E_PROFILING",
    18: "HCCL_E_CCE",
    19: "HCCL_E_NETWORK",
    20: "HCCL_E_AGAIN",
    21: "HCCL_E_REMOTE",
    22: "HCCL_E_SUSPENDING",
}
HCCL_SUCCESS = 0
HCCL_E_PARA = 1
HCCL_E_PTR = 2
HCCL_E_NOT_SUPPORT = 5
HCCL_E_UNAVAIL = 7
HCCL_E_TIMEOUT = 9
HCCL_E_TCP_CONNECT = 11


class HcclDataTypeEnum:
    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BFP16 = 11
    INT128 = 12

    @classmethod
    @functools.cache
    def _torch_map(cls) -> dict[torch.dtype, int]:
        table = {
            torch.int8: cls.INT8,
            torch.int16: cls.INT16,
            torch.int32: cls.INT32,
            torch.int64: cls.INT64,
            torch.uint8: cls.UINT8,
            torch.float16: cls.FP16,
            torch.float32: cls.FP32,
            torch.float64: cls.FP64,
            torch.bfloat16: cls.BFP16,
        }
        for name, value in (("uint16", cls.UINT16), ("uint32", cls.UINT32),
                            ("uint64", cls.UINT64)):
            if hasattr(torch, name):
                table[getattr(torch, name)] = value
        return table

    @classmethod
    def supports_torch_dtype(cls, dtype: torch.dtype) -> bool:
        return dtype in cls._torch_map()

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> int:
        try:
            return cls._torch_map()[dtype]
        except KeyError:
            names = ", ".join(str(d).removeprefix("torch.") for d in cls._torch_map())
            raise ValueError(f"HCCL does not support dtype {dtype}; supported: {names}") from None


class HcclReduceOpEnum:
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3

    @classmethod
    def from_torch(cls, op: ReduceOp | Any) -> int:
        if op == ReduceOp.SUM:
            return cls.SUM
        if op == ReduceOp.PRODUCT:
            return cls.PROD
        if op == ReduceOp.MAX:
            return cls.MAX
        if op == ReduceOp.MIN:
            return cls.MIN
        raise ValueError(f"HCCL does not support reduce op {op}; use SUM, PRODUCT, MAX or MIN")


# === errors ================================================================================


class HcclError(RuntimeError):
    """A non-zero HcclResult: `code`, `name`, `call`, `rank`, and the library's detail."""

    def __init__(self, code: int, call: str, rank: int | None = None, string: str = "",
                 detail: str = ""):
        self.code = code
        self.name = HCCL_RESULT_NAMES.get(code, "HCCL_E_UNKNOWN")
        self.call = call
        self.rank = rank
        self.string = string
        self.detail = detail
        where = f"rank {rank}" if rank is not None else "rank ?"
        msg = f"{call} failed on {where}: HcclResult {code} ({self.name}: {string or '?'})"
        if detail:
            msg += f" - {detail}"
        super().__init__(msg)


class HcclLibraryNotFound(FileNotFoundError):
    """No libhccl to load (or the simulator was not built)."""


# === locating the library ==================================================================


def _cann_candidates() -> list[Path]:
    found = []
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if home:
        found.append(Path(home) / "lib64" / "libhccl.so")
    found.append(Path("/usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so"))
    return found


def find_hccl_library(simulated: bool | None = None) -> tuple[str, str]:
    """(path, kind) of the library to load; kind is "env", "cann" or "simulator".

    ``HCCL_LIBRARY_PATH`` always wins. Otherwise the device decides (`select_backend`, the
    one place that decides device vs simulation): a real NPU loads CANN's libhccl, the
    simulated NPU the simulator (a real libhccl cannot work on host buffers).
    """
    explicit = HCCL_LIBRARY_PATH.get()
    if explicit:
        if not Path(explicit).is_file():
            raise HcclLibraryNotFound(f"HCCL_LIBRARY_PATH={explicit} is not a file")
        return explicit, "env"
    if simulated is None:
        from vllm_npu.device import select_backend

        simulated = select_backend().simulated
    if not simulated:
        for cand in _cann_candidates():
            if cand.is_file():
                return str(cand), "cann"
        raise HcclLibraryNotFound(
            "libhccl.so not found (looked in "
            + ", ".join(str(c) for c in _cann_candidates())
            + "); source CANN's set_env.sh or set HCCL_LIBRARY_PATH")
    if not SIMULATOR_PATH.is_file():
        raise HcclLibraryNotFound(
            f"the HCCL simulator library {SIMULATOR_PATH} is not built: vllm_npu was "
            "installed without a C compiler. Install gcc and reinstall vllm_npu (`pip "
            f"install vllm_npu`, or `{BUILD_COMMAND}`); tensor/pipeline/data parallelism on "
            "the simulated NPU needs it")
    newest_source = max((s.stat().st_mtime for s in SIMULATOR_SOURCES if s.is_file()), default=0)
    if newest_source > SIMULATOR_PATH.stat().st_mtime:
        logger.warning("vllm_npu: %s is older than its sources in csrc/; rebuild with %s",
                       SIMULATOR_PATH, BUILD_COMMAND)
    return str(SIMULATOR_PATH), "simulator"


# === the library ===========================================================================


@dataclass(frozen=True)
class Function:
    name: str
    restype: Any
    argtypes: list[Any]
    required: bool = True


_c_uint64_p = ctypes.c_void_p  # host arrays of uint64_t (HcclAlltoAllV's counts/displs)


class HcclLibrary:
    exported_functions: ClassVar[list[Function]] = [
        # const char *HcclGetErrorString(HcclResult code);
        Function("HcclGetErrorString", ctypes.c_char_p, [HcclResult_t]),
        # HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
        Function("HcclGetRootInfo", HcclResult_t, [ctypes.POINTER(HcclRootInfo)]),
        # HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
        #                                 uint32_t rank, HcclComm *comm);
        Function("HcclCommInitRootInfo", HcclResult_t,
                 [ctypes.c_uint32, ctypes.POINTER(HcclRootInfo), ctypes.c_uint32,
                  ctypes.POINTER(HcclComm_t)]),
        # HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count,
        #     HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream);
        Function("HcclAllReduce", HcclResult_t,
                 [buffer_type, buffer_type, ctypes.c_uint64, HcclDataType_t, HcclReduceOp_t,
                  HcclComm_t, aclrtStream_t]),
        # HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType,
        #     uint32_t root, HcclComm comm, aclrtStream stream);
        Function("HcclBroadcast", HcclResult_t,
                 [buffer_type, ctypes.c_uint64, HcclDataType_t, ctypes.c_uint32, HcclComm_t,
                  aclrtStream_t]),
        # HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
        #     HcclDataType dataType, HcclComm comm, aclrtStream stream);
        Function("HcclAllGather", HcclResult_t,
                 [buffer_type, buffer_type, ctypes.c_uint64, HcclDataType_t, HcclComm_t,
                  aclrtStream_t]),
        # HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
        #     HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream);
        Function("HcclReduceScatter", HcclResult_t,
                 [buffer_type, buffer_type, ctypes.c_uint64, HcclDataType_t, HcclReduceOp_t,
                  HcclComm_t, aclrtStream_t]),
        # HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType,
        #     uint32_t destRank, HcclComm comm, aclrtStream stream);
        Function("HcclSend", HcclResult_t,
                 [buffer_type, ctypes.c_uint64, HcclDataType_t, ctypes.c_uint32, HcclComm_t,
                  aclrtStream_t]),
        # HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType,
        #     uint32_t srcRank, HcclComm comm, aclrtStream stream);
        Function("HcclRecv", HcclResult_t,
                 [buffer_type, ctypes.c_uint64, HcclDataType_t, ctypes.c_uint32, HcclComm_t,
                  aclrtStream_t]),
        # HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount,
        #     HcclDataType sendType, const void *recvBuf, uint64_t recvCount,
        #     HcclDataType recvType, HcclComm comm, aclrtStream stream);
        Function("HcclAlltoAll", HcclResult_t,
                 [buffer_type, ctypes.c_uint64, HcclDataType_t, buffer_type, ctypes.c_uint64,
                  HcclDataType_t, HcclComm_t, aclrtStream_t]),
        # HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts,
        #     const void *sdispls, HcclDataType sendType, const void *recvBuf,
        #     const void *recvCounts, const void *rdispls, HcclDataType recvType,
        #     HcclComm comm, aclrtStream stream);   (counts/displs: uint64_t[nRanks])
        Function("HcclAlltoAllV", HcclResult_t,
                 [buffer_type, _c_uint64_p, _c_uint64_p, HcclDataType_t, buffer_type,
                  _c_uint64_p, _c_uint64_p, HcclDataType_t, HcclComm_t, aclrtStream_t],
                 required=False),
        # HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
        Function("HcclBarrier", HcclResult_t, [HcclComm_t, aclrtStream_t]),
        # HcclResult HcclCommDestroy(HcclComm comm);
        Function("HcclCommDestroy", HcclResult_t, [HcclComm_t]),
        # HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
        Function("HcclGetRankSize", HcclResult_t,
                 [HcclComm_t, ctypes.POINTER(ctypes.c_uint32)], required=False),
        # HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
        Function("HcclGetRankId", HcclResult_t,
                 [HcclComm_t, ctypes.POINTER(ctypes.c_uint32)], required=False),
        # simulator only: const char *HcclSimGetLastError(void);
        Function("HcclSimGetLastError", ctypes.c_char_p, [], required=False),
    ]

    # path -> (CDLL, {name: function}); a library is opened and typed once per process
    _loaded: ClassVar[dict[str, tuple[ctypes.CDLL, dict[str, Any]]]] = {}

    def __init__(self, so_file: str | None = None):
        if so_file is None:
            so_file, kind = find_hccl_library()
        else:
            kind = "given"
        self.path = so_file
        self.kind = kind
        if so_file not in HcclLibrary._loaded:
            try:
                lib = ctypes.CDLL(so_file)
            except OSError as e:
                raise HcclLibraryNotFound(f"failed to load HCCL library {so_file}: {e}") from e
            funcs: dict[str, Any] = {}
            for func in self.exported_functions:
                try:
                    f = getattr(lib, func.name)
                except AttributeError:
                    if func.required:
                        raise HcclLibraryNotFound(
                            f"{so_file} does not export {func.name}") from None
                    continue
                f.restype = func.restype
                f.argtypes = func.argtypes
                funcs[func.name] = f
            HcclLibrary._loaded[so_file] = (lib, funcs)
            logger.info("vllm_npu: HCCL library %s (%s)", so_file,
                        "CPU simulator" if "HcclSimGetLastError" in funcs else kind)
        self.lib, self._funcs = HcclLibrary._loaded[so_file]
        self.simulator = "HcclSimGetLastError" in self._funcs

    def has_symbol(self, name: str) -> bool:
        return name in self._funcs

    # --- errors ----------------------------------------------------------------------------

    def HcclGetErrorString(self, code: int) -> str:
        s = self._funcs["HcclGetErrorString"](code)
        return s.decode("utf-8", "replace") if s else ""

    def last_error_detail(self) -> str:
        if not self.simulator:
            return ""
        s = self._funcs["HcclSimGetLastError"]()
        return s.decode("utf-8", "replace") if s else ""

    def check(self, result: int, call: str, rank: int | None) -> None:
        if result != HCCL_SUCCESS:
            raise HcclError(result, call, rank, self.HcclGetErrorString(result),
                            self.last_error_detail())

    # --- setup -----------------------------------------------------------------------------

    def HcclGetRootInfo(self, rank: int | None = 0) -> HcclRootInfo:
        root = HcclRootInfo()
        self.check(self._funcs["HcclGetRootInfo"](ctypes.byref(root)), "HcclGetRootInfo", rank)
        return root

    @staticmethod
    def root_info_to_bytes(root: HcclRootInfo) -> bytes:
        return bytes(root.internal)

    @staticmethod
    def root_info_from_bytes(data: bytes) -> HcclRootInfo:
        if len(data) != HCCL_ROOT_INFO_BYTES:
            raise ValueError(f"root info must be {HCCL_ROOT_INFO_BYTES} bytes, got {len(data)}")
        root = HcclRootInfo()
        ctypes.memmove(ctypes.addressof(root), data, HCCL_ROOT_INFO_BYTES)
        return root

    def HcclCommInitRootInfo(self, nranks: int, root: HcclRootInfo, rank: int) -> HcclComm_t:
        comm = HcclComm_t()
        if not (0 <= nranks < 2**32 and 0 <= rank < 2**32):
            raise HcclError(HCCL_E_PARA, "HcclCommInitRootInfo", rank,
                            self.HcclGetErrorString(HCCL_E_PARA),
                            f"nRanks={nranks} / rank={rank} do not fit uint32")
        self.check(self._funcs["HcclCommInitRootInfo"](nranks, ctypes.byref(root), rank,
                                                       ctypes.byref(comm)),
                   "HcclCommInitRootInfo", rank)
        return comm

    def HcclCommDestroy(self, comm: HcclComm_t, rank: int | None = None) -> None:
        self.check(self._funcs["HcclCommDestroy"](comm), "HcclCommDestroy", rank)

    def HcclGetRankSize(self, comm: HcclComm_t, rank: int | None = None) -> int:
        out = ctypes.c_uint32()
        self.check(self._funcs["HcclGetRankSize"](comm, ctypes.byref(out)), "HcclGetRankSize",
                   rank)
        return out.value

    def HcclGetRankId(self, comm: HcclComm_t, rank: int | None = None) -> int:
        out = ctypes.c_uint32()
        self.check(self._funcs["HcclGetRankId"](comm, ctypes.byref(out)), "HcclGetRankId", rank)
        return out.value

    # --- collectives (buffers are raw addresses: tensor.data_ptr()) --------------------------

    def HcclAllReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                      comm: HcclComm_t, stream: int | None, rank: int | None = None) -> None:
        self.check(self._funcs["HcclAllReduce"](sendbuf, recvbuf, count, datatype, op, comm,
                                                stream), "HcclAllReduce", rank)

    def HcclBroadcast(self, buf: int, count: int, datatype: int, root: int, comm: HcclComm_t,
                      stream: int | None, rank: int | None = None) -> None:
        self.check(self._funcs["HcclBroadcast"](buf, count, datatype, root, comm, stream),
                   "HcclBroadcast", rank)

    def HcclAllGather(self, sendbuf: int, recvbuf: int, sendcount: int, datatype: int,
                      comm: HcclComm_t, stream: int | None, rank: int | None = None) -> None:
        self.check(self._funcs["HcclAllGather"](sendbuf, recvbuf, sendcount, datatype, comm,
                                                stream), "HcclAllGather", rank)

    def HcclReduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                          op: int, comm: HcclComm_t, stream: int | None,
                          rank: int | None = None) -> None:
        self.check(self._funcs["HcclReduceScatter"](sendbuf, recvbuf, recvcount, datatype, op,
                                                    comm, stream), "HcclReduceScatter", rank)

    def HcclSend(self, sendbuf: int, count: int, datatype: int, dest: int, comm: HcclComm_t,
                 stream: int | None, rank: int | None = None) -> None:
        self.check(self._funcs["HcclSend"](sendbuf, count, datatype, dest, comm, stream),
                   "HcclSend", rank)

    def HcclRecv(self, recvbuf: int, count: int, datatype: int, src: int, comm: HcclComm_t,
                 stream: int | None, rank: int | None = None) -> None:
        self.check(self._funcs["HcclRecv"](recvbuf, count, datatype, src, comm, stream),
                   "HcclRecv", rank)

    def HcclAlltoAll(self, sendbuf: int, sendcount: int, sendtype: int, recvbuf: int,
                     recvcount: int, recvtype: int, comm: HcclComm_t, stream: int | None,
                     rank: int | None = None) -> None:
        self.check(self._funcs["HcclAlltoAll"](sendbuf, sendcount, sendtype, recvbuf,
                                               recvcount, recvtype, comm, stream),
                   "HcclAlltoAll", rank)

    def HcclAlltoAllV(self, sendbuf: int, sendcounts: Sequence[int], sdispls: Sequence[int],
                      sendtype: int, recvbuf: int, recvcounts: Sequence[int],
                      rdispls: Sequence[int], recvtype: int, comm: HcclComm_t,
                      stream: int | None, rank: int | None = None) -> None:
        if "HcclAlltoAllV" not in self._funcs:
            raise NotImplementedError(f"{self.path} does not export HcclAlltoAllV")
        arrays = [(ctypes.c_uint64 * len(a))(*a) for a in (sendcounts, sdispls, recvcounts,
                                                          rdispls)]
        self.check(self._funcs["HcclAlltoAllV"](
            sendbuf, ctypes.addressof(arrays[0]), ctypes.addressof(arrays[1]), sendtype,
            recvbuf, ctypes.addressof(arrays[2]), ctypes.addressof(arrays[3]), recvtype,
            comm, stream), "HcclAlltoAllV", rank)

    def HcclBarrier(self, comm: HcclComm_t, stream: int | None,
                    rank: int | None = None) -> None:
        self.check(self._funcs["HcclBarrier"](comm, stream), "HcclBarrier", rank)


__all__ = [
    "BUILD_COMMAND",
    "HCCL_LIBRARY_PATH",
    "HCCL_RESULT_NAMES",
    "HCCL_ROOT_INFO_BYTES",
    "HCCL_SIM_BUFFER_MB",
    "HCCL_SIM_TIMEOUT_S",
    "HcclDataTypeEnum",
    "HcclError",
    "HcclLibrary",
    "HcclLibraryNotFound",
    "HcclReduceOpEnum",
    "HcclRootInfo",
    "find_hccl_library",
]
