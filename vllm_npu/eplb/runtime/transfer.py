"""D2DExpertWeightLoader: one MoE layer's expert weights moved between EP ranks.

    old placement ──plan_transfers──> [(slot p <- expert e, from old slot q)]   same on every rank
         │
    rank r:  for each transfer into its slots: local copy (it held e) or irecv from q's rank
             for each transfer out of its slots: isend its old weights of e
             ──batch_isend_irecv (NPUCommunicator)──> staging buffers (one layer, S slots)
         │
    every rank reports ok / failed ──all EP ranks agree──> commit (staging -> weights, then the
    routing tables) or roll back (staging dropped; old weights and old placement keep serving)

Weights are read from the old placement and written only at commit, so a failed layer
leaves nothing half-moved.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Sequence

import torch

from vllm_npu import envs

logger = logging.getLogger("vllm.npu")


@dataclass(frozen=True)
class Transfer:
    slot: int       # destination physical slot
    expert: int     # logical expert it will hold
    src_slot: int   # a physical slot holding that expert in the old placement
    dst_rank: int
    src_rank: int

    @property
    def local(self) -> bool:
        return self.dst_rank == self.src_rank


def plan_transfers(old: Sequence[int], new: Sequence[int],
                   slots_per_rank: int) -> list[Transfer]:
    """Every slot whose expert changes, and where its weights come from: the destination
    rank's own old copy when it has one, else the old holder whose rank has sent the least
    so far (ties: lowest slot), so hot experts' senders share the work. Deterministic:
    every rank computes the same list, which fixes the order of each pair's messages."""
    holders: dict[int, list[int]] = defaultdict(list)
    for q, e in enumerate(old):
        holders[int(e)].append(q)
    sent: Counter[int] = Counter()
    out = []
    for p, (was, e) in enumerate(zip(old, new)):
        e = int(e)
        if int(was) == e:
            continue
        rank = p // slots_per_rank
        own = [q for q in holders[e] if q // slots_per_rank == rank]
        if own:
            src = own[0]
        else:
            src = min(holders[e], key=lambda q: (sent[q // slots_per_rank], q))
            sent[src // slots_per_rank] += 1
        out.append(Transfer(p, e, src, rank, src // slots_per_rank))
    return out


def slot_bytes(weights: tuple[torch.Tensor, ...]) -> int:
    """Bytes of one physical slot's expert tensors (w13 and w2, and scales if int8)."""
    return sum(w[0].numel() * w.element_size() for w in weights)


class EPGroup:
    """The EP group as the runtime uses it: host collectives for agreement, device
    point-to-point for weights. `tp_size`: ranks that see the same tokens."""

    def __init__(self, cpu_group, device_communicator, rank: int, size: int,
                 global_ranks: list[int], tp_size: int) -> None:
        self.cpu_group, self.comm = cpu_group, device_communicator
        self.rank, self.size, self.ranks, self.tp_size = rank, size, global_ranks, tp_size

    @classmethod
    def from_vllm(cls) -> "EPGroup":
        from vllm.distributed import get_ep_group, get_tp_group

        ep = get_ep_group()
        return cls(ep.cpu_group, ep.device_communicator, ep.rank_in_group, ep.world_size,
                   list(ep.ranks), get_tp_group().world_size)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of a host tensor over the EP ranks (in place)."""
        if self.size > 1:
            torch.distributed.all_reduce(t, group=self.cpu_group)
        return t

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """EP rank 0's host tensor on every rank (in place)."""
        if self.size > 1:
            torch.distributed.broadcast(t, src=self.ranks[0], group=self.cpu_group)
        return t

    def p2p(self, ops: list) -> None:
        if ops:
            self.comm.batch_isend_irecv(ops)


class D2DExpertWeightLoader:
    """Moves one layer at a time into staging buffers shaped like one layer's weights."""

    def __init__(self, group: EPGroup, weights: tuple[torch.Tensor, ...],
                 slots_per_rank: int, timeout_s: float) -> None:
        self.group, self.slots_per_rank, self.timeout_s = group, slots_per_rank, timeout_s
        self.staging = tuple(torch.empty_like(w) for w in weights)
        self.faults = list(envs.NPU_EPLB_FAIL_TRANSFER.get())

    def bytes_moved(self, weights: tuple[torch.Tensor, ...], transfers: list[Transfer]) -> int:
        """Bytes this rank receives from other ranks for these transfers."""
        return slot_bytes(weights) * sum(1 for t in transfers
                                         if t.dst_rank == self.group.rank and not t.local)

    def transfer(self, layer_id: int, weights: tuple[torch.Tensor, ...],
                 transfers: list[Transfer]) -> str | None:
        """Fill the staging slots this rank receives. None when complete, else why not."""
        me, first = self.group.rank, self.group.rank * self.slots_per_rank
        start = time.perf_counter()
        try:
            ops = []
            for t in transfers:
                for w, stage in zip(weights, self.staging):
                    if t.src_rank == me and not t.local:
                        ops.append(torch.distributed.P2POp(
                            torch.distributed.isend, w[t.src_slot - first],
                            self.group.ranks[t.dst_rank]))
                    elif t.dst_rank == me and t.local:
                        stage[t.slot - first].copy_(w[t.src_slot - first])
                    elif t.dst_rank == me:
                        ops.append(torch.distributed.P2POp(
                            torch.distributed.irecv, stage[t.slot - first],
                            self.group.ranks[t.src_rank]))
            self.group.p2p(ops)
            self._inject(layer_id)
        except Exception as e:  # a failed transfer must never take the engine down
            return f"{type(e).__name__}: {e}"
        elapsed = time.perf_counter() - start
        if elapsed > self.timeout_s:
            return f"timed out after {elapsed:.2f} s (transfer_timeout_s {self.timeout_s:g})"
        return None

    def commit(self, weights: tuple[torch.Tensor, ...],
               transfers: list[Transfer]) -> None:
        first = self.group.rank * self.slots_per_rank
        for t in transfers:
            if t.dst_rank == self.group.rank:
                for w, stage in zip(weights, self.staging):
                    w[t.slot - first].copy_(stage[t.slot - first])

    def _inject(self, layer_id: int) -> None:
        hits = [f for f in self.faults if (f.layer_id, f.rank) == (layer_id, self.group.rank)]
        if not hits:
            return
        fault = hits[0]
        self.faults.remove(fault)  # once
        for stage in self.staging:
            stage.fill_(float("nan") if stage.is_floating_point() else -1)
        if fault.kind == "timeout":
            time.sleep(self.timeout_s * 1.1)
            return
        raise RuntimeError(f"injected transfer failure ({envs.NPU_EPLB_FAIL_TRANSFER.name})")
