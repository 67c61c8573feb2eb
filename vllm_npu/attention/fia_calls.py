"""The fused-attention calls the attention backends issue, as graph tasks or eagerly.

A call is (args, kwargs) in `npu_fused_infer_attention_score`'s (v1) argument names. With
attention sinks it goes to `npu_fused_infer_attention_score_v2`, the only FIA that takes
them (`learnable_sink`; op-plugin op_plugin_functions.yaml, vllm-ascend attention_v1.py
passes gpt-oss's sinks the same way), under v2's names for the same arguments.
"""
from __future__ import annotations

import torch

from vllm_npu import ops

# v1 name -> v2 name (op-plugin npu_fused_infer_attention_score_v2 schema)
V2_NAMES = {"num_heads": "num_query_heads", "scale": "softmax_scale",
             "actual_seq_lengths": "actual_seq_qlen", "actual_seq_lengths_kv": "actual_seq_kvlen",
             "softmax_lse_flag": "return_softmax_lse"}


def _v2(kwargs: dict, sinks: torch.Tensor) -> dict:
    v2 = {V2_NAMES.get(name, name): value for name, value in kwargs.items()}
    v2["learnable_sink"] = sinks
    return v2


def fia_out(call: tuple[tuple, dict], out: torch.Tensor, lse: torch.Tensor,
            workspace: torch.Tensor | None, sinks: torch.Tensor | None = None) -> None:
    args, kwargs = call
    if sinks is None:
        ops.npu_fused_infer_attention_score_out(*args, out=[out, lse], workspace=workspace,
                                                **kwargs)
    else:
        ops.npu_fused_infer_attention_score_v2_out(*args, out=[out, lse], workspace=workspace,
                                                   **_v2(kwargs, sinks))


def fia_max_workspace(call: tuple[tuple, dict],
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    args, kwargs = call
    if sinks is None:
        return ops._npu_fused_infer_attention_score_get_max_workspace(*args, **kwargs)
    return ops._npu_fused_infer_attention_score_v2_get_max_workspace(*args, **_v2(kwargs, sinks))


def as_task(backend, fn, *args):
    """fn(*args), as one task group of the graph being captured when `backend` is given:
    returns (task handle or None, fn's result)."""
    if backend is None:
        return None, fn(*args)
    stream = backend.current_stream()
    backend.task_group_begin(stream)
    result = fn(*args)
    return backend.task_group_end(stream), result
