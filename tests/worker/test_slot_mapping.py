"""The vectorised slot mapping vs a per-token reference written from the definition."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.worker.slot_mapping import compute_slot_mapping

PAD = -1


def reference(query_lens, positions, block_table, bs, world, rank, inter):
    out = []
    t = 0
    for req, n in enumerate(query_lens):
        for _ in range(n):
            p = int(positions[t])
            vblock, off = divmod(p, bs * world)
            if (off // inter) % world != rank:
                out.append(PAD)
            else:
                local = (off // (world * inter)) * inter + off % inter
                out.append(int(block_table[req, vblock]) * bs + local)
            t += 1
    return out


@pytest.mark.parametrize("world,rank,inter", [(1, 0, 1), (2, 0, 1), (2, 1, 1), (2, 1, 4),
                                              (4, 3, 16)])
def test_matches_reference_with_context_parallel_interleave(world, rank, inter):
    g = torch.Generator().manual_seed(world * 10 + rank + inter)
    bs, max_reqs, max_blocks = 16, 6, 12
    query_lens = [5, 1, 37, 16, 1]  # prefills, decodes, block boundaries
    starts = [int(x) for x in torch.randint(0, 60, (len(query_lens),), generator=g)]
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, query_lens)])
    block_table = torch.randperm(max_reqs * max_blocks, generator=g).view(
        max_reqs, max_blocks).to(torch.int32)
    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
    num_tokens, max_tokens = int(qsl[-1]), int(qsl[-1]) + 7
    slot_mapping = torch.full((max_tokens,), 12345, dtype=torch.int64)
    compute_slot_mapping(num_tokens, max_tokens, qsl, positions, block_table,
                         block_table.stride(0), slot_mapping, bs, world, rank, inter, PAD)
    want = reference(query_lens, positions, block_table, bs, world, rank, inter)
    assert slot_mapping[:num_tokens].tolist() == want
    assert slot_mapping[num_tokens:].tolist() == [PAD] * 7  # padding for graph replay


def test_registered_as_vllms_kernel_override():
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    current_platform.register_triton_kernel_overrides()
    original, impl = dispatcher._registry[
        "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel"]
    assert impl is compute_slot_mapping


def test_override_registers_even_with_numba_loaded():
    """vLLM 0.33's kernel scan trips over llvmlite's lazy `lib` (numba is an EPLB dependency)."""
    import numba  # noqa: F401
    from vllm.triton_utils import dispatcher

    from vllm_npu.kernel_overrides import register_kernel_overrides
    from vllm_npu.worker.slot_mapping import KERNEL

    register_kernel_overrides()
    assert dispatcher._registry[KERNEL][1] is compute_slot_mapping
    assert "llvmlite.binding.ffi" in __import__("sys").modules  # restored afterwards
