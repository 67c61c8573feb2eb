"""Expert parallelism: how tokens reach the ranks holding their experts, and come back.

EP group = DP x TP ranks (vLLM's definition); EP rank r holds physical slots [r*S, (r+1)*S).
Within a DP rank the TP ranks hold the same tokens.

all_gather (graph-capturable; small decode batches):
    gather every DP rank's tokens, routing weights and slots (all-gather over DP)
    -> each rank runs its own slots on all tokens -> reduce-scatter over DP gives each DP
    rank the sum over its DP peers; vLLM's runner then all-reduces over TP.
all_to_all (eager batches; needs the counts on the host):
    each TP rank takes 1/TP of its tokens; a token travels once to each rank holding one
    of its experts (counts exchanged first, then all-to-all-v of hidden states, top-k
    slots and weights); that rank runs its slots and returns one weighted row; the origin
    adds the rows into its share (zeros elsewhere) and vLLM's runner all-reduces over TP.

On a device the fused form of both is MC2 (`npu_moe_distribute_dispatch` /
`npu_moe_distribute_combine`, HCCL's in-kernel dispatch/combine sized by the graph
capture batch); only the collectives above run on the simulated NPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vllm_npu.moe.experts import Experts, run_local_experts

logger = logging.getLogger("vllm.npu")


@dataclass(frozen=True)
class EPLayout:
    ep_rank: int
    ep_size: int
    tp_rank: int
    tp_size: int
    dp_size: int
    slots_per_rank: int

    @property
    def first_slot(self) -> int:
        return self.ep_rank * self.slots_per_rank

    @property
    def num_physical(self) -> int:
        return self.ep_size * self.slots_per_rank


_seen: set[str] = set()


def dispatch_mode(setting: str, min_tokens: int, num_tokens: int, capturing: bool) -> str:
    """Same answer on every EP rank: `num_tokens` is the largest DP rank's batch."""
    mode = setting
    if setting == "auto":
        mode = "all_to_all" if not capturing and num_tokens >= min_tokens else "all_gather"
    if mode not in _seen:
        _seen.add(mode)
        logger.info("vllm_npu: MoE expert-parallel dispatch %s (first used at %d tokens)",
                    mode, num_tokens)
    return mode


def dp_sizes() -> list[int] | None:
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    meta = get_forward_context().dp_metadata
    return None if meta is None else meta.num_tokens_across_dp_cpu.tolist()


def all_gather_experts(x, weights, slots, experts: Experts, layout: EPLayout,
                       sizes: list[int] | None) -> torch.Tensor:
    """`sizes`: every DP rank's token count (None without DP)."""
    if sizes is not None:
        from vllm.distributed import get_dp_group

        dp = get_dp_group()
        x, weights, slots = (dp.all_gatherv(t, 0, sizes) for t in (x, weights, slots))
    out = run_local_experts(x, weights, slots, experts, layout.first_slot,
                            layout.num_physical)
    if sizes is not None:
        out = dp.reduce_scatterv(out, 0, sizes)
    return out


def _share(num_tokens: int, rank: int, size: int) -> tuple[int, int]:
    per = -(-num_tokens // size)
    return min(rank * per, num_tokens), min((rank + 1) * per, num_tokens)


def all_to_all_experts(x, weights, slots, experts: Experts, layout: EPLayout) -> torch.Tensor:
    """Each token goes once to every rank holding one of its experts (with its top-k
    slots and weights); that rank returns the weighted sum of its own experts' outputs;
    the origin adds the returned rows up."""
    from vllm.distributed import get_ep_group

    comm = get_ep_group().device_communicator
    lo, hi = _share(x.shape[0], layout.tp_rank, layout.tp_size)
    xs, ws, ss = x[lo:hi], weights[lo:hi], slots[lo:hi]
    # (rank, token) pairs, rank-major: token t goes to rank r if one of its slots is there.
    wanted = torch.zeros(xs.shape[0], layout.ep_size, dtype=torch.bool, device=x.device)
    wanted.scatter_(1, ss.long() // layout.slots_per_rank, True)
    rank, token = wanted.T.nonzero(as_tuple=True)
    send_splits = torch.bincount(rank, minlength=layout.ep_size)
    recv_splits = torch.empty_like(send_splits)
    comm.all_to_all(recv_splits, send_splits)  # what every rank will send me
    send, recv = send_splits.tolist(), recv_splits.tolist()  # host sync: eager path only
    n = sum(recv)

    def exchange(t: torch.Tensor) -> torch.Tensor:
        out = t.new_empty((n,) + tuple(t.shape[1:]))
        return comm.all_to_all_v(out, t[token].contiguous(), recv, send)

    got_x, got_w, got_slots = exchange(xs), exchange(ws), exchange(ss)
    done = (run_local_experts(got_x, got_w, got_slots, experts, layout.first_slot,
                              layout.num_physical) if n else got_x)
    back = xs.new_empty((token.numel(), xs.shape[1]))
    comm.all_to_all_v(back, done, send, recv)
    mine = torch.zeros_like(xs).index_add_(0, token, back)
    if layout.tp_size == 1:
        return mine
    out = torch.zeros_like(x)
    out[lo:hi] = mine
    return out
