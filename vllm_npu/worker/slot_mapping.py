"""Token -> KV-cache slot mapping (replaces vLLM's Triton kernel): vectorised torch, or on
the simulated NPU one native call (`ops/sim/index_kernels.py`, ~7 us instead of ~50).

Registered through `Platform.register_triton_kernel_overrides` (`vllm_npu.kernel_overrides`)
under `KERNEL`; called with that kernel's
parameters in order. With context parallelism of world W and interleave I, a request's
"virtual block" spans block_size * W positions; position p is stored on rank
(p_in_vblock // I) % W, everything else gets PAD_ID:

    p -> vblock = p // (bs*W), off = p % (bs*W)
         local  = (off // I) % W == rank
         slot   = block_table[req, vblock] * bs + (off // (W*I)) * I + off % I
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import index_kernels


def compute_slot_mapping(num_tokens: int, max_num_tokens: int, query_start_loc: torch.Tensor,
                         positions: torch.Tensor, block_table: torch.Tensor,
                         block_table_stride: int, slot_mapping: torch.Tensor,
                         KV_CACHE_BLOCK_SIZE: int, TOTAL_CP_WORLD_SIZE: int = 1,
                         TOTAL_CP_RANK: int = 0, CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
                         PAD_ID: int = -1, BLOCK_SIZE: int = 1024) -> None:
    bs, world, rank = KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK
    inter = CP_KV_CACHE_INTERLEAVE_SIZE
    if index_kernels.slot_mapping(num_tokens, max_num_tokens, query_start_loc, positions,
                                  block_table, block_table_stride, slot_mapping, bs, world,
                                  rank, inter, PAD_ID):
        return  # the simulated NPU's kernel: one native call
    qsl = query_start_loc.long()
    num_reqs = qsl.numel() - 1
    counts = qsl[1:] - qsl[:-1]
    req = torch.repeat_interleave(torch.arange(num_reqs, device=qsl.device), counts,
                                  output_size=num_tokens)
    pos = positions[:num_tokens].long()
    vbs = bs * world
    vblock, off = pos // vbs, pos % vbs
    block_numbers = block_table.reshape(-1)[req * block_table_stride + vblock].long()
    slots = block_numbers * bs + (off // (world * inter)) * inter + off % inter
    if world > 1:
        slots = torch.where((off // inter) % world == rank, slots, PAD_ID)
    slot_mapping[:num_tokens] = slots
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


KERNEL = "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel"
