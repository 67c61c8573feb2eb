"""PyHcclCommunicator: HCCL collectives called directly through ctypes.

The counterpart of vLLM's PyNcclCommunicator. It is built from a CPU process group
(gloo), which carries only the root info at creation: rank 0 of the group calls
HcclGetRootInfo and broadcasts its 4108 bytes, then every rank joins with
HcclCommInitRootInfo. The collectives take tensors' data pointers, and

  * on an Ascend NPU (real libhccl): NPU tensors and the current NPU stream;
  * on the simulated NPU (the CPU simulator from csrc/): CPU tensors and no stream,
    every call being synchronous.

`vllm_npu.device.select_backend()` alone decides which of the two applies.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp

from vllm_npu.distributed.hccl_library import (
    HCCL_ROOT_INFO_BYTES,
    HcclDataTypeEnum,
    HcclLibrary,
    HcclReduceOpEnum,
)

logger = logging.getLogger("vllm.npu")


class PyHcclCommunicator:
    def __init__(self, group: ProcessGroup, device: int | str | torch.device,
                 library_path: str | None = None):
        """`group`: a CPU (gloo) process group; `device`: this rank's NPU (ignored, CPU, in
        simulation). `library_path` overrides the library search (tests, tools)."""
        from vllm_npu.device import select_backend

        if not dist.is_initialized():
            raise RuntimeError("PyHcclCommunicator needs torch.distributed to be initialized")
        backend = dist.get_backend(group)
        if backend in ("nccl", "hccl"):
            raise ValueError(f"PyHcclCommunicator wants a CPU (gloo) group, got a {backend} one")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.simulated = select_backend().simulated
        if self.simulated:
            self.device = torch.device("cpu")
        else:
            if isinstance(device, int):
                device = torch.device(f"npu:{device}")
            elif isinstance(device, str):
                device = torch.device(device)
            self.device = device
        self.lib = HcclLibrary(library_path)
        self.available = True
        self.disabled = False

        if self.rank == 0:
            root = self.lib.HcclGetRootInfo(self.rank)
            payload = torch.frombuffer(bytearray(HcclLibrary.root_info_to_bytes(root)),
                                       dtype=torch.uint8)
        else:
            payload = torch.empty(HCCL_ROOT_INFO_BYTES, dtype=torch.uint8)
        dist.broadcast(payload, src=dist.get_global_rank(group, 0), group=group)
        root = HcclLibrary.root_info_from_bytes(payload.numpy().tobytes())

        if self.simulated:
            self.comm = self.lib.HcclCommInitRootInfo(self.world_size, root, self.rank)
        else:
            with torch.npu.device(self.device):
                self.comm = self.lib.HcclCommInitRootInfo(self.world_size, root, self.rank)
        self._destroyed = False
        logger.debug("vllm_npu: PyHcclCommunicator rank %d/%d on %s (%s)", self.rank,
                     self.world_size, self.device, self.lib.path)

    # --- helpers ------------------------------------------------------------------------------

    def _stream(self, stream):
        """The aclrtStream handle to pass: none in simulation, else the current NPU stream."""
        if self.simulated:
            return None
        if stream is None:
            stream = torch.npu.current_stream()
        return stream.npu_stream

    def _check_open(self, call: str) -> None:
        if self._destroyed:
            raise RuntimeError(f"PyHcclCommunicator.{call}: the communicator was destroyed")

    def _check_tensor(self, t: torch.Tensor, call: str, what: str) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"PyHcclCommunicator.{call}: {what} must be a torch.Tensor")
        if not t.is_contiguous():
            raise ValueError(f"PyHcclCommunicator.{call}: {what} must be contiguous (shape "
                             f"{tuple(t.shape)}, stride {t.stride()}); pass t.contiguous()")
        if t.device.type != self.device.type or (
                self.device.index is not None and t.device.index != self.device.index):
            raise ValueError(f"PyHcclCommunicator.{call}: {what} is on {t.device}, this "
                             f"communicator on {self.device}")
        if not HcclDataTypeEnum.supports_torch_dtype(t.dtype):
            HcclDataTypeEnum.from_torch(t.dtype)  # raises the ValueError naming the dtypes

    def _check_peer(self, peer: int, call: str, what: str) -> None:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"PyHcclCommunicator.{call}: {what}={peer} is not a rank of a "
                             f"group of {self.world_size}")

    # --- collectives --------------------------------------------------------------------------

    def all_reduce(self, in_tensor: torch.Tensor, out_tensor: torch.Tensor | None = None,
                   op: ReduceOp = ReduceOp.SUM, stream=None) -> torch.Tensor:
        """Out-of-place all-reduce: returns `out_tensor` (a new tensor when None)."""
        self._check_open("all_reduce")
        self._check_tensor(in_tensor, "all_reduce", "in_tensor")
        if out_tensor is None:
            out_tensor = torch.empty_like(in_tensor)
        self._check_tensor(out_tensor, "all_reduce", "out_tensor")
        if out_tensor.numel() != in_tensor.numel() or out_tensor.dtype != in_tensor.dtype:
            raise ValueError("PyHcclCommunicator.all_reduce: out_tensor must match in_tensor "
                             "in size and dtype")
        self.lib.HcclAllReduce(in_tensor.data_ptr(), out_tensor.data_ptr(), in_tensor.numel(),
                               HcclDataTypeEnum.from_torch(in_tensor.dtype),
                               HcclReduceOpEnum.from_torch(op), self.comm,
                               self._stream(stream), self.rank)
        return out_tensor

    def all_gather(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                   stream=None) -> None:
        """`output_tensor` gets the world_size inputs concatenated in rank order."""
        self._check_open("all_gather")
        self._check_tensor(input_tensor, "all_gather", "input_tensor")
        self._check_tensor(output_tensor, "all_gather", "output_tensor")
        if (output_tensor.numel() != input_tensor.numel() * self.world_size
                or output_tensor.dtype != input_tensor.dtype):
            raise ValueError("PyHcclCommunicator.all_gather: output_tensor must hold "
                             f"world_size ({self.world_size}) x input_tensor of its dtype")
        self.lib.HcclAllGather(input_tensor.data_ptr(), output_tensor.data_ptr(),
                               input_tensor.numel(),
                               HcclDataTypeEnum.from_torch(input_tensor.dtype), self.comm,
                               self._stream(stream), self.rank)

    def reduce_scatter(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                       op: ReduceOp = ReduceOp.SUM, stream=None) -> None:
        """Reduce `input_tensor` (world_size equal parts) and keep this rank's part."""
        self._check_open("reduce_scatter")
        self._check_tensor(input_tensor, "reduce_scatter", "input_tensor")
        self._check_tensor(output_tensor, "reduce_scatter", "output_tensor")
        if (input_tensor.numel() != output_tensor.numel() * self.world_size
                or output_tensor.dtype != input_tensor.dtype):
            raise ValueError("PyHcclCommunicator.reduce_scatter: input_tensor must hold "
                             f"world_size ({self.world_size}) x output_tensor of its dtype")
        self.lib.HcclReduceScatter(input_tensor.data_ptr(), output_tensor.data_ptr(),
                                   output_tensor.numel(),
                                   HcclDataTypeEnum.from_torch(input_tensor.dtype),
                                   HcclReduceOpEnum.from_torch(op), self.comm,
                                   self._stream(stream), self.rank)

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        self._check_open("broadcast")
        self._check_tensor(tensor, "broadcast", "tensor")
        self._check_peer(src, "broadcast", "src")
        self.lib.HcclBroadcast(tensor.data_ptr(), tensor.numel(),
                               HcclDataTypeEnum.from_torch(tensor.dtype), src, self.comm,
                               self._stream(stream), self.rank)

    def send(self, tensor: torch.Tensor, dst: int, stream=None) -> None:
        """Blocking in simulation: returns once `dst` has received everything."""
        self._check_open("send")
        self._check_tensor(tensor, "send", "tensor")
        self._check_peer(dst, "send", "dst")
        self.lib.HcclSend(tensor.data_ptr(), tensor.numel(),
                          HcclDataTypeEnum.from_torch(tensor.dtype), dst, self.comm,
                          self._stream(stream), self.rank)

    def recv(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        self._check_open("recv")
        self._check_tensor(tensor, "recv", "tensor")
        self._check_peer(src, "recv", "src")
        self.lib.HcclRecv(tensor.data_ptr(), tensor.numel(),
                          HcclDataTypeEnum.from_torch(tensor.dtype), src, self.comm,
                          self._stream(stream), self.rank)

    def all_to_all(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                   output_split_sizes: list[int] | None = None,
                   input_split_sizes: list[int] | None = None, stream=None) -> None:
        """Like torch.distributed.all_to_all_single: split dim 0 of `input_tensor` in
        world_size parts (equal, or `input_split_sizes` rows), part j to rank j; the parts
        received land in `output_tensor` in rank order (`output_split_sizes` rows)."""
        call = "all_to_all"
        self._check_open(call)
        self._check_tensor(input_tensor, call, "input_tensor")
        self._check_tensor(output_tensor, call, "output_tensor")
        if output_tensor.dtype != input_tensor.dtype:
            raise ValueError(f"PyHcclCommunicator.{call}: dtypes differ")
        dtype = HcclDataTypeEnum.from_torch(input_tensor.dtype)
        n = self.world_size
        if output_split_sizes is None and input_split_sizes is None:
            if input_tensor.numel() % n or output_tensor.numel() != input_tensor.numel():
                raise ValueError(f"PyHcclCommunicator.{call}: with equal splits both tensors "
                                 f"must have the same numel, divisible by {n}")
            count = input_tensor.numel() // n
            self.lib.HcclAlltoAll(input_tensor.data_ptr(), count, dtype,
                                  output_tensor.data_ptr(), count, dtype, self.comm,
                                  self._stream(stream), self.rank)
            return

        def counts(t: torch.Tensor, splits: list[int] | None, what: str) -> list[int]:
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if splits is None:
                if rows % n:
                    raise ValueError(f"PyHcclCommunicator.{call}: {what} has {rows} rows, "
                                     f"not divisible by {n}")
                splits = [rows // n] * n
            if len(splits) != n or sum(splits) != rows or min(splits) < 0:
                raise ValueError(f"PyHcclCommunicator.{call}: {what} split sizes {splits} "
                                 f"must be {n} non-negative row counts summing to {rows}")
            return [s * row for s in splits]

        scounts = counts(input_tensor, input_split_sizes, "input")
        rcounts = counts(output_tensor, output_split_sizes, "output")
        sdispls = [sum(scounts[:j]) for j in range(n)]
        rdispls = [sum(rcounts[:j]) for j in range(n)]
        self.lib.HcclAlltoAllV(input_tensor.data_ptr(), scounts, sdispls, dtype,
                               output_tensor.data_ptr(), rcounts, rdispls, dtype, self.comm,
                               self._stream(stream), self.rank)

    def barrier(self, stream=None) -> None:
        self._check_open("barrier")
        self.lib.HcclBarrier(self.comm, self._stream(stream), self.rank)

    def destroy(self) -> None:
        """Release the communicator (idempotent); not collective."""
        if getattr(self, "_destroyed", True):
            return
        self._destroyed = True
        self.lib.HcclCommDestroy(self.comm, self.rank)
        self.comm = None
