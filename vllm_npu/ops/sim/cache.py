"""Simulated ATB `_npu_reshape_and_cache`: scatter new K/V tokens into their cache slots.

    slot s  ->  block s // block_size, offset s % block_size;  s < 0 (padding) is skipped
    key [T, Hkv, D] -> key_cache [num_blocks, block_size, Hkv, D]
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.checks import NPUOpError, check_contiguous, check_dim, check_dtype


_OP = "_npu_reshape_and_cache"


def _check(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
           value_cache: torch.Tensor, slot_indices: torch.Tensor) -> None:
    """The op's checks (ATB's, when it is launched)."""
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache),
                    ("value_cache", value_cache)):
        check_dtype(_OP, name, t)
    check_dim(_OP, "key", key, 3)
    check_dim(_OP, "key_cache", key_cache, 4)
    check_contiguous(_OP, key_cache=key_cache, value_cache=value_cache)
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise NPUOpError(f"{_OP}: key/value dtype {key.dtype} must match the cache "
                         f"dtype {key_cache.dtype}")
    if key.shape[1:] != key_cache.shape[2:] or value.shape[1:] != value_cache.shape[2:]:
        raise NPUOpError(f"{_OP}: key {tuple(key.shape)} does not fit cache "
                         f"{tuple(key_cache.shape)}")
    if slot_indices.dtype != torch.int32 or slot_indices.shape != (key.shape[0],):
        raise NPUOpError(f"{_OP}: slot_indices must be int32 of shape ({key.shape[0]},), got "
                         f"{slot_indices.dtype} {tuple(slot_indices.shape)}")


def _npu_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, slot_indices: torch.Tensor) -> None:
    _check(key, value, key_cache, value_cache, slot_indices)
    capacity = key_cache.shape[0] * key_cache.shape[1]
    if native.scatter_rows(key, slot_indices, key_cache) == -1 and \
            native.scatter_rows(value, slot_indices, value_cache) == -1:
        return  # both written in one pass each (a refusal writes nothing: reported below)
    slots = slot_indices.long()
    if slots.numel():
        lowest, highest = (int(v) for v in torch.aminmax(slots))
        if highest >= capacity:
            raise NPUOpError(f"{_OP}: slot indices must be < {capacity} (negative = padding, "
                             f"skipped), got max {highest}")
        if lowest < 0:  # PAD_SLOT_ID (-1) marks padding tokens of a graph batch
            keep = slots >= 0
            slots, key, value = slots[keep], key[keep], value[keep]
    key_cache.view(capacity, *key_cache.shape[2:]).index_copy_(0, slots, key)
    value_cache.view(capacity, *value_cache.shape[2:]).index_copy_(0, slots, value)


def reshape_and_cache_launch(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                             value_cache: torch.Tensor, slot_indices: torch.Tensor):
    """The op issued as a graph task: its checks now, then the native scatters' launch
    (graph.graph_op's `launcher`; None where they do not cover the call: the replay runs
    the op). The slots are device data, read at replay: one past the cache is refused
    there, before anything is written."""
    _check(key, value, key_cache, value_cache, slot_indices)
    capacity = key_cache.shape[0] * key_cache.shape[1]

    def refused(status: int) -> None:
        raise NPUOpError(f"{_OP}: slot indices must be < {capacity} (negative = padding, "
                         "skipped)")
    keys = native.scatter_launch(key, slot_indices, key_cache, refused)
    values = native.scatter_launch(value, slot_indices, value_cache, refused)
    if keys is None or values is None:
        return None
    return keys, values


_SISO = "_npu_reshape_and_cache_siso"


def _npu_reshape_and_cache_siso(key: torch.Tensor, key_cache: torch.Tensor,
                                slot_indices: torch.Tensor) -> None:
    """ATB ReshapeAndCache with one input and one cache ("single in, single out";
    torch_npu `_npu_reshape_and_cache_siso(key, key_cache, slot_indices)`, op-plugin's ATB
    binding; torch_npu test_reshape_and_cache_siso: negative slots skipped): the
    DeepSeek-V3.2 indexer's key rows into its own cache."""
    for name, t in (("key", key), ("key_cache", key_cache)):
        check_dtype(_SISO, name, t)
    check_dim(_SISO, "key", key, 3)
    check_dim(_SISO, "key_cache", key_cache, 4)
    check_contiguous(_SISO, key_cache=key_cache)
    if key.dtype != key_cache.dtype or key.shape[1:] != key_cache.shape[2:]:
        raise NPUOpError(f"{_SISO}: key {key.dtype} {tuple(key.shape)} does not fit cache "
                         f"{key_cache.dtype} {tuple(key_cache.shape)}")
    if slot_indices.dtype != torch.int32 or slot_indices.shape != (key.shape[0],):
        raise NPUOpError(f"{_SISO}: slot_indices must be int32 of shape ({key.shape[0]},), "
                         f"got {slot_indices.dtype} {tuple(slot_indices.shape)}")
    capacity = key_cache.shape[0] * key_cache.shape[1]
    slots = slot_indices.long()
    if slots.numel() and int(slots.max()) >= capacity:
        raise NPUOpError(f"{_SISO}: slot indices must be < {capacity} (negative = padding, "
                         f"skipped), got max {int(slots.max())}")
    keep = slots >= 0
    key_cache.view(capacity, *key_cache.shape[2:]).index_copy_(0, slots[keep], key[keep])
