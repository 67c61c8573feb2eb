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

