"""NPUCommunicator: the platform's device communicator, over the HCCL binding.

Every collective on the device group goes through `PyHcclCommunicator` (ctypes HCCL): on
an NPU the real libhccl, on the simulated NPU the CPU HCCL simulator from `csrc/` — the
same binding code either way. On the simulated NPU each call is also a graph op, so a
captured ACL graph replays its collectives like the device does.
"""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)

from vllm_npu.device import select_backend


def _graph_aware(fn):
    if select_backend().simulated:
        from vllm_npu.ops.sim.graph import graph_op

        return graph_op(fn)
    return fn


@_graph_aware
def _all_reduce(comm, x: torch.Tensor) -> torch.Tensor:
    return comm.all_reduce(x.contiguous())


@_graph_aware
def _all_gather(comm, x: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.empty((world * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype,
                      device=x.device)
    comm.all_gather(out, x.contiguous())
    return out


@_graph_aware
def _reduce_scatter(comm, x: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.empty((x.shape[0] // world,) + tuple(x.shape[1:]), dtype=x.dtype,
                      device=x.device)
    comm.reduce_scatter(out, x.contiguous())
    return out


_SEND_OPS = (torch.distributed.isend, torch.distributed.send)


class NPUCommunicator(DeviceCommunicatorBase):
    def __init__(self, cpu_group: ProcessGroup, device: torch.device | None = None,
                 device_group: ProcessGroup | None = None, unique_name: str = "",
                 global_ranks: list[int] | None = None,
                 global_world_size: int | None = None, use_all2all: bool = False) -> None:
        super().__init__(cpu_group, device, device_group, unique_name, global_ranks,
                         global_world_size, use_all2all)
        self.hccl = None
        if self.world_size > 1:
            from vllm_npu.distributed.pyhccl import PyHcclCommunicator

            self.hccl = PyHcclCommunicator(group=self.cpu_group, device=self.device)
        if self.use_all2all and self.world_size > 1:
            # vLLM's all-gather / reduce-scatter manager (generic group collectives, which
            # land in this communicator). The NPU MoE method moves its own tokens
            # (vllm_npu/moe/dispatch.py); vLLM's runner only asks this manager about
            # fault tolerance and, for methods without internal dispatch, to dispatch.
            from vllm.distributed.device_communicators.all2all import AgRsAll2AllManager

            self.all2all_manager = AgRsAll2AllManager(self.cpu_group)

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.hccl is None:
            return input_
        return _all_reduce(self.hccl, input_)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.hccl is None:
            return input_
        dim = dim % input_.dim()
        gathered = _all_gather(self.hccl, input_.movedim(dim, 0), self.world_size)
        return gathered.movedim(0, dim).contiguous()

    def all_gatherv(self, input_, dim: int = 0, sizes: list[int] | None = None):
        """Uneven all-gather along `dim`: pad every rank to the largest size, gather, trim."""
        if isinstance(input_, list):
            return [self.all_gatherv(t, dim, sizes) for t in input_]
        if sizes is None:
            return self.all_gather(input_, dim)
        dim = dim % input_.dim()
        pad = max(sizes) - input_.shape[dim]
        padded = torch.nn.functional.pad(input_.movedim(dim, -1), (0, pad)).movedim(-1, dim)
        chunks = self.all_gather(padded, dim).split(max(sizes), dim=dim)
        return torch.cat([c.narrow(dim, 0, n) for c, n in zip(chunks, sizes)], dim=dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.hccl is None:
            return input_
        dim = dim % input_.dim()
        if input_.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: dim {dim} of size {input_.shape[dim]} does "
                             f"not split over {self.world_size} ranks")
        out = _reduce_scatter(self.hccl, input_.movedim(dim, 0), self.world_size)
        return out.movedim(0, dim).contiguous()

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1,
                        sizes: list[int] | None = None) -> torch.Tensor:
        """Uneven reduce-scatter along `dim`: pad every rank's part to the largest size,
        reduce-scatter, trim."""
        if sizes is None or self.hccl is None:
            return self.reduce_scatter(input_, dim)
        dim = dim % input_.dim()
        width = max(sizes)
        parts = [torch.nn.functional.pad(p.movedim(dim, -1), (0, width - n)).movedim(-1, dim)
                 for p, n in zip(input_.split(sizes, dim=dim), sizes)]
        out = self.reduce_scatter(torch.cat(parts, dim=dim), dim)
        return out.narrow(dim, 0, sizes[self.rank_in_group])

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1):
        gathered = self.all_gather(input_, dim)
        return gathered if self.rank_in_group == dst else None

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.hccl is not None:
            self.hccl.broadcast(tensor, src)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        dst = (self.rank_in_group + 1) % self.world_size if dst is None else dst
        self.hccl.send(tensor.contiguous(), dst)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None):
        src = (self.rank_in_group - 1) % self.world_size if src is None else src
        tensor = torch.empty(size, dtype=dtype, device=self.device)
        self.hccl.recv(tensor, src)
        return tensor

    def batch_isend_irecv(self, p2p_ops: list) -> list:
        """`torch.distributed.P2POp`s (peers are global ranks), completed before returning.

        HCCL send blocks until the peer receives, so the ops are grouped by peer in
        ascending group rank, and within each pair the lower rank sends first — both sides
        agree on every pair's order, so no two ranks wait on each other."""
        mine = self.rank_in_group
        by_peer: dict[int, list] = {}
        for op in p2p_ops:
            by_peer.setdefault(self.ranks.index(op.peer), []).append(op)
        for peer in sorted(by_peer):
            ops = by_peer[peer]
            sends = [op for op in ops if op.op in _SEND_OPS]
            recvs = [op for op in ops if op not in sends]
            for group in ((sends, recvs) if mine < peer else (recvs, sends)):
                for op in group:
                    if op in sends:
                        self.hccl.send(op.tensor.contiguous(), peer)
                    else:
                        self.hccl.recv(op.tensor, peer)
        return []

    def all_to_all(self, output: torch.Tensor, input_: torch.Tensor) -> torch.Tensor:
        if self.hccl is None:
            return output.copy_(input_)
        self.hccl.all_to_all(output, input_.contiguous())
        return output

    def all_to_all_v(self, output: torch.Tensor, input_: torch.Tensor,
                     output_split_sizes: list[int], input_split_sizes: list[int]) -> torch.Tensor:
        """Rows input_[sum(in[:j]) : +in[j]] go to rank j; rank j's rows land in order.
        The split sizes are host values, so this is never part of a captured graph."""
        from vllm_npu.compilation.graph_backend import get_graph_backend

        if get_graph_backend().is_capturing():
            raise RuntimeError("all_to_all_v needs host-side split sizes and cannot be "
                               "captured in a graph; use the all-gather path there")
        if self.hccl is None:
            return output.copy_(input_)
        self.hccl.all_to_all(output, input_.contiguous(), output_split_sizes,
                             input_split_sizes)
        return output

    def destroy(self) -> None:
        # The manager holds vLLM's DP/TP groups: drop it so they can be freed with them.
        self.all2all_manager = None
        if self.hccl is not None:
            self.hccl.destroy()
            self.hccl = None
