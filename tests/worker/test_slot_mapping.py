"""The slot mapping (the simulated NPU's native kernel and the vectorised torch path) vs a
per-token reference written from the definition."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import index_kernels, native
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


@pytest.fixture(params=["native", "torch"])
def path(request, monkeypatch):
    """Each case on the native kernel (asserted taken) and on the torch path."""
    if request.param == "torch":
        monkeypatch.setattr(index_kernels, "slot_mapping", lambda *a: False)
        yield request.param
        return
    assert native.library() is not None, "the native library was not built"
    taken, real = [], index_kernels.slot_mapping
    monkeypatch.setattr(index_kernels, "slot_mapping", lambda *a: taken.append(real(*a)) or
                        taken[-1])
    yield request.param
    assert taken and all(taken), taken


@pytest.mark.parametrize("world,rank,inter", [(1, 0, 1), (2, 0, 1), (2, 1, 1), (2, 1, 4),
                                              (4, 3, 16)])
def test_matches_reference_with_context_parallel_interleave(path, world, rank, inter):
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


def _batch(positions):
    block_table = torch.arange(12, dtype=torch.int32).view(3, 4)
    qsl = torch.tensor([0, 2, len(positions)], dtype=torch.int32)
    return qsl, torch.tensor(positions), block_table, torch.zeros(8, dtype=torch.int64)


def test_native_kernel_taken_and_refuses_a_position_past_the_table():
    qsl, positions, block_table, out = _batch([3, 17, 63, 2])
    assert index_kernels.slot_mapping(4, 8, qsl, positions, block_table, 4, out, 16, 1, 0,
                                      1, PAD)
    assert out.tolist() == [3, 17, 4 * 16 + 63 % 16 + 3 * 16, 4 * 16 + 2] + [PAD] * 4
    qsl, positions, block_table, out = _batch([3, 17, 64, 2])  # block 4 of a 4-block row
    with pytest.raises(IndexError, match="token 2 at position 64 is outside"):
        compute_slot_mapping(4, 8, qsl, positions, block_table, 4, out, 16)
    with pytest.raises(ValueError, match=r"query_start_loc \[0, 2, 5\] does not split"):
        compute_slot_mapping(4, 8, torch.tensor([0, 2, 5], dtype=torch.int32), positions,
                             block_table, 4, out, 16)


def test_native_kernel_leaves_other_layouts_to_torch():
    qsl, positions, block_table, out = _batch([3, 17, 63, 2])
    assert not index_kernels.slot_mapping(4, 8, qsl.long(), positions, block_table, 4, out,
                                          16, 1, 0, 1, PAD)
    assert not index_kernels.slot_mapping(4, 8, qsl, positions, block_table.t(), 4, out, 16,
                                          1, 0, 1, PAD)
    compute_slot_mapping(4, 8, qsl.long(), positions, block_table, 4, out, 16)
    assert out.tolist() == [3, 17, 4 * 16 + 63 % 16 + 3 * 16, 4 * 16 + 2] + [PAD] * 4


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


def test_the_scan_for_modules_vllm_cannot_scan_warns_nothing():
    """Looking at every module attribute touches deprecated ones (torch.distributed's
    `reduce_op` warns on access); the plugin's own scan keeps those warnings out of
    every `vllm` command's output."""
    import warnings

    import torch.distributed  # noqa: F401

    from vllm_npu.kernel_overrides import _modules_that_break_the_scan

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _modules_that_break_the_scan()
    assert [str(w.message) for w in seen if w.category is FutureWarning] == []
