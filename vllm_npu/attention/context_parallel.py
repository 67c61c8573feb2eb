"""Decode context parallelism (DCP) shared by the NPU attention backends.

With DCP of world W (a slice of the TP group) a request's KV cache is sharded over the W
ranks by position: with interleave I, position p lives on rank (p // I) % W (vLLM's slot
mapping writes -1 for every other rank). A step's attention therefore splits in two:

    context   the tokens cached before this step, sharded: every rank attends the queries of
              all W ranks' heads (all-gathered) over its local shard, non-causally; the W
              partial results are merged per head with their log-sum-exps
    new       this step's tokens, whose K/V every rank holds in full for its own heads:
              ordinary causal attention

and the two partial results are merged once more by log-sum-exp. Both merges are exact
(`npu_attention_update`), so DCP output equals unsharded attention up to float rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

from vllm_npu import ops

LOWEST_LSE = torch.finfo(torch.float32).min  # an empty shard's lse, as the device op takes it


@dataclass(frozen=True, slots=True)
class DCPMetadata:
    """One step's context shard on this rank."""
    local_context_lens: list[int]  # host, per request: cached tokens stored on this rank
    any_context: bool              # whether any request has cached context on any rank


def build_dcp_metadata(context_lens: torch.Tensor, world: int, rank: int,
                       interleave: int) -> DCPMetadata:
    """context_lens: host int tensor [num_reqs] of cached tokens per request (all ranks)."""
    local = get_dcp_local_seq_lens(context_lens, world, rank, interleave)
    # Decided from global lengths: every rank must take the same (collective) path.
    return DCPMetadata(local_context_lens=local.tolist(),
                       any_context=bool(context_lens.numel() and int(context_lens.max()) > 0))


def merge_partials(outs: list[torch.Tensor], lses: list[torch.Tensor]):
    """Exact merge of partial attention over disjoint key sets.

    outs: [T, H, D] each, lses: [T, H] float32 each (-inf where a part had no keys).
    Returns out [T, H, D] in outs' dtype and lse [T, H]."""
    t, h, d = outs[0].shape
    out, lse = ops.npu_attention_update(
        [x.clamp_min(LOWEST_LSE).reshape(t * h).contiguous() for x in lses],
        [o.reshape(t * h, d).contiguous() for o in outs], 1)
    return out.view(t, h, d), lse.view(t, h)


def combine_over_ranks(group, out: torch.Tensor, lse: torch.Tensor, num_heads: int):
    """Each DCP rank computed all W*H gathered heads over its shard; return this rank's
    H heads merged over all shards.

    out [T, W*H, D], lse [T, W*H] -> out [T, H, D], lse [T, H]. One all-gather carries
    outputs and lses together (packed in float32, which round-trips fp16/bf16 exactly).
    """
    t, _, d = out.shape
    packed = torch.cat((out.float(), lse.unsqueeze(-1)), dim=-1)
    gathered = group.all_gather(packed, dim=0).view(group.world_size, t, -1, d + 1)
    heads = slice(group.rank_in_group * num_heads, (group.rank_in_group + 1) * num_heads)
    mine = gathered[:, :, heads]
    return merge_partials([m[..., :d].to(out.dtype) for m in mine],
                          [m[..., d] for m in mine])


CORRECT_KERNEL = "vllm.v1.attention.ops.dcp.CorrectAttnCPOutKernel.kernel"
_LN2 = math.log(2.0)


def correct_attn_cp_out(outputs, new_output, lses, vlse, outputs_stride_B, outputs_stride_H,
                        outputs_stride_D, lses_stride_N, lses_stride_B, lses_stride_H,
                        lse_idx, HEAD_DIM, N_ROUNDED, IS_BASE_E) -> None:  # noqa: N803
    """vLLM's `CorrectAttnCPOutKernel` (its MLA layer's DCP combine, ahead of a
    reduce-scatter over heads) in torch: with the all-gathered lses [N, B, H], write the
    merged lse [B, H] into `vlse` and outputs [B, H, D] * exp(lses[lse_idx] - merged)
    into `new_output`. NaN / +inf lses count as empty shards (-inf), like the kernel's.
    Strides are the tensors' own; the stride arguments only mirror the kernel's."""
    lse = lses.float()
    lse = torch.where(torch.isnan(lse) | (lse == float("inf")), float("-inf"), lse)
    if not IS_BASE_E:
        lse = lse * _LN2
    merged = torch.logsumexp(lse, dim=0)  # all -inf -> -inf
    factor = torch.exp(lse[lse_idx] - merged).nan_to_num(0.0)  # (-inf) - (-inf) -> 0
    vlse.copy_(merged if IS_BASE_E else merged / _LN2)
    new_output.copy_(outputs * factor.unsqueeze(-1).to(outputs.dtype))


# vLLM's CP launcher splits positional from compile-time arguments by counting the
# kernel's constexprs; without Triton its stand-in kernel declares none.
correct_attn_cp_out.constexprs = ("HEAD_DIM", "N_ROUNDED", "IS_BASE_E")


def gather_sharded_rows(group, local: list[torch.Tensor], context_lens: list[int],
                        interleave: int) -> list[torch.Tensor]:
    """Rebuild each request's cached rows, in position order, from all DCP ranks' shards.

    local[r]: this rank's rows of request r in position order, [n_local, F]. Returns, per
    request, [context_lens[r], F]. One all-gather; every rank must call it together.
    """
    world = group.world_size
    lens = torch.tensor(context_lens, dtype=torch.int32)
    pads = get_dcp_local_seq_lens(lens, world, 0, interleave).tolist()  # rank 0 holds most
    width = local[0].shape[-1]
    padded = torch.cat([torch.nn.functional.pad(rows, (0, 0, 0, pad - rows.shape[0]))
                        for rows, pad in zip(local, pads)])
    gathered = group.all_gather(padded, dim=0).view(world, -1, width)
    out, offset = [], 0
    for n, pad in zip(context_lens, pads):
        pos = torch.arange(n)
        rank = (pos // interleave) % world
        index = (pos // (world * interleave)) * interleave + pos % interleave
        out.append(gathered[rank, offset + index])
        offset += pad
    return out
