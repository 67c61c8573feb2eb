"""How the NPU lays out a layer's KV memory, where it differs from vLLM's logical shape.

Two parts of the plugin address that memory: the attention backend that reads and writes
it (attention/mla.py) and the KV connector that copies it between instances block by
block (distributed/kv_transfer/mooncake.py). Both take the layout from here, so neither
reaches into the other.
"""
from __future__ import annotations

import torch


def latent_planes(kv_cache: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One MLA layer's cache memory, as vLLM sizes it ([num_blocks, bs, L+R]), laid out
    as two contiguous planes: nope [num_blocks, bs, 1, L], then rope [num_blocks, bs,
    1, R]. The ATB MLA ops take the two parts as separate dense tensors (a strided view
    of one [.., L+R] row would be copied whole on every call); vllm-ascend allocates
    them separately. A block's rows sit at the same block index in both planes, so
    vLLM's block ids, prefix caching and memory accounting are unchanged; per-block
    byte copies (KV transfer) must copy both planes' ranges."""
    nb, bs, width = kv_cache.shape
    if not kv_cache.is_contiguous():
        raise ValueError(f"NPU MLA: the latent cache must be contiguous to hold its two "
                         f"planes, got stride {kv_cache.stride()}")
    flat = kv_cache.view(-1)
    split = nb * bs * kv_lora_rank
    return (flat[:split].view(nb, bs, 1, kv_lora_rank),
            flat[split:].view(nb, bs, 1, width - kv_lora_rank))



def paired_planes(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention layer's cache memory ([num_blocks, 2, bs, C] as vLLM views it) as the
    contiguous K and V caches the NPU's cache-write and attention ops take (ATB
    ReshapeAndCache and FIA read dense [blocks, bs, ...] tensors; a strided plane would
    be copied whole on every call). Returns (k, v).

    Separate planes (LHBNC, every model without Mamba-style state): K = kv_cache[:, 0]
    and V = kv_cache[:, 1] are each contiguous; vLLM's block ids address both.

    Block-compact pages (LBHNC, hybrid models: a block's bytes are one page, so Mamba
    state pages can alias attention pages): block b holds K rows then V rows. Viewed as
    2 * num_blocks half-pages, K of block b is half-page 2b and V of block b is half-page
    2b + 1; so K = halves[:-1] and V = halves[1:] are both contiguous and both address
    block b at index 2b ("paired"): the attention metadata doubles block ids and shifts
    slots (paired_block_ids / paired_slots). vllm-ascend reaches contiguous K and V for
    hybrid models differently (its model runner splits the shared buffer into a K half
    and a V half and sizes attention blocks so one K half-page equals one SSM state,
    patching vLLM's Mamba config); vLLM 0.33's layout contract makes that patch
    unnecessary."""
    k, v = kv_cache[:, 0], kv_cache[:, 1]
    if k.is_contiguous() and v.is_contiguous():
        return k, v
    if not kv_cache.is_contiguous():
        raise ValueError(f"NPU attention: a KV cache of stride {kv_cache.stride()} is "
                         "neither separate K/V planes nor block-compact pages")
    halves = kv_cache.view(-1, *kv_cache.shape[2:])
    return halves[:-1], halves[1:]


def paired_block_ids(block_table: torch.Tensor) -> torch.Tensor:
    """In place: block ids of block-compact pages as indices of their K (and V)
    half-page."""
    return block_table.mul_(2)


def paired_slots(slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """In place: slot s = b * bs + o -> 2b * bs + o. Padding slots (< 0) stay negative."""
    return slots.add_(torch.div(slots, block_size, rounding_mode="floor") * block_size)
