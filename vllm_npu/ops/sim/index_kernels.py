"""The simulated NPU's index kernels (`csrc/sim_index.c`): the token -> KV slot mapping and
the greedy sampler's argmax, once per step each, a few microseconds instead of a chain of
torch calls on the host's thread.

Each returns False (writing nothing) where it does not cover the case: no library (an
install without a C compiler), a tensor not on the CPU, not contiguous or of another dtype;
the caller keeps its torch path then, which gives the same result.
"""
from __future__ import annotations

import functools

import torch

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.native import _i64, _ptr


@functools.cache
def _functions():
    lib = native.library()
    if lib is None:
        return None
    slots = lib.npu_sim_slot_mapping
    slots.argtypes = [_i64, _i64, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _i64, _i64, _i64,
                      _i64]
    slots.restype = _i64
    argmax = lib.npu_sim_argmax_rows
    argmax.argtypes = [_ptr, _i64, _i64, _i64, _ptr]
    argmax.restype = None
    return slots, argmax


def _on_host(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()


def slot_mapping(num_tokens: int, max_num_tokens: int, query_start_loc: torch.Tensor,
                 positions: torch.Tensor, block_table: torch.Tensor, stride: int,
                 out: torch.Tensor, block_size: int, world: int, rank: int, interleave: int,
                 pad: int) -> bool:
    """`out[t]` = the KV slot of token t (worker/slot_mapping.py has the formula), `pad`
    for tokens [num_tokens, max_num_tokens); False where not covered. Raises IndexError for
    a position outside its request's block-table row, ValueError for request starts that
    do not split [0, num_tokens)."""
    functions = _functions()
    if functions is None or not (_on_host(query_start_loc, torch.int32)
                                 and _on_host(positions, torch.int64)
                                 and _on_host(block_table, torch.int32)
                                 and _on_host(out, torch.int64)) \
            or positions.numel() < num_tokens or out.numel() < max_num_tokens \
            or block_table.dim() != 2 or block_table.stride(0) != stride \
            or query_start_loc.numel() > block_table.shape[0] + 1:
        return False
    status = functions[0](num_tokens, max_num_tokens, query_start_loc.data_ptr(),
                          query_start_loc.numel() - 1, positions.data_ptr(),
                          block_table.data_ptr(), stride, out.data_ptr(), block_size, world,
                          rank, interleave, pad)
    if status == -1:
        raise ValueError(f"slot mapping: query_start_loc {query_start_loc.tolist()} does "
                         f"not split the {num_tokens} tokens into requests")
    if status:
        t = status - 1
        raise IndexError(f"slot mapping: token {t} at position {int(positions[t])} is "
                         f"outside its request's block table ({stride} blocks of "
                         f"{block_size * world} positions)")
    return True


def argmax_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """torch.argmax(logits, dim=-1) of a 2-D float32 CPU tensor with unit column stride
    (first maximum; first NaN where a row has one), int64; None where not covered."""
    functions = _functions()
    if functions is None or logits.dim() != 2 or logits.device.type != "cpu" \
            or logits.dtype != torch.float32 or logits.stride(1) != 1 or not logits.shape[1]:
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    functions[1](logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0),
                 out.data_ptr())
    return out
