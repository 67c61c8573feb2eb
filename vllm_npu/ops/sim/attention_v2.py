"""Simulated `torch_npu.npu_fused_infer_attention_score_v2`: FIA with v2's argument names
and the one v2 feature the plugin uses, attention sinks (`learnable_sink`).

op-plugin `op_plugin/config/op_plugin_functions.yaml` (npu_fused_infer_attention_score_v2,
its `.out` variant and `_npu_fused_infer_attention_score_v2_get_max_workspace`) renames
v1's arguments (num_heads -> num_query_heads, scale -> softmax_scale, actual_seq_lengths(_kv)
-> actual_seq_qlen / actual_seq_kvlen, softmax_lse_flag -> return_softmax_lse) and adds
`learnable_sink`; v1 has none (its kernel passes a null sink, FusedInferAttentionScore
KernelNpuOpApi.cpp). The sink is one logit per query head that joins every row's softmax
without a value (torch_npu's v2 test reference `npSoftmax_new(x, sinks)`):

    p_j = exp(s_j) / (exp(sink_h) + sum_k exp(s_k)),   out = sum_j p_j v_j
        = out_v1 * sigmoid(lse_v1 - sink_h)

Limits from the op's documentation (torch_npu-npu_fused_infer_attention_score_v2.md):
`learnable_sink` is [Q_N] bfloat16 (float32 beside a float32 query: the simulator's
float32 extension), TND layout only, value head dim <= 128, not with quantised inputs.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import attention
from vllm_npu.ops.sim.checks import NPUOpError

_OP = "npu_fused_infer_attention_score_v2"
_RENAMED = {"num_query_heads": "num_heads", "softmax_scale": "scale",
            "actual_seq_qlen": "actual_seq_lengths", "actual_seq_kvlen": "actual_seq_lengths_kv",
            "return_softmax_lse": "softmax_lse_flag"}
_SINK_MAX_HEAD_DIM = 128


def _v1_kwargs(kwargs: dict) -> dict:
    v1 = {}
    for name, value in kwargs.items():
        if name in _RENAMED.values():
            raise NPUOpError(f"{_OP}: unknown argument {name!r} (v1's name; v2 takes "
                             f"{[k for k, v in _RENAMED.items() if v == name][0]!r})")
        v1[_RENAMED.get(name, name)] = value
    return v1


def _check_sink(sink: torch.Tensor, query: torch.Tensor, value: torch.Tensor,
                kwargs: dict) -> None:
    heads = query.shape[1]
    allowed = (torch.bfloat16, torch.float32) if query.dtype == torch.float32 \
        else (torch.bfloat16,)
    if sink.dtype not in allowed or sink.shape != (heads,):
        raise NPUOpError(f"{_OP}: learnable_sink must be [{heads}] "
                         f"{' or '.join(map(str, allowed))}, got {tuple(sink.shape)} "
                         f"{sink.dtype}")
    if kwargs.get("input_layout") != "TND":
        raise NPUOpError(f"{_OP}: learnable_sink needs input_layout 'TND', got "
                         f"{kwargs.get('input_layout')!r}")
    hkv = kwargs.get("num_key_value_heads") or heads
    d_v = value.shape[-1] // hkv if kwargs.get("block_table") is not None else value.shape[-1]
    if d_v > _SINK_MAX_HEAD_DIM:
        raise NPUOpError(f"{_OP}: learnable_sink takes value head dims up to "
                         f"{_SINK_MAX_HEAD_DIM}, got {d_v}")


def npu_fused_infer_attention_score_v2(query: torch.Tensor, key: torch.Tensor,
                                       value: torch.Tensor, *,
                                       learnable_sink: torch.Tensor | None = None, **kwargs):
    """(attention_out [T, N, Dv], softmax_lse [T, N, 1] float32 or a 1-element dummy)."""
    v1 = _v1_kwargs(kwargs)
    if learnable_sink is None:
        return attention.npu_fused_infer_attention_score(query, key, value, **v1)
    _check_sink(learnable_sink, query, value, kwargs)
    want_lse = v1.pop("softmax_lse_flag", False)
    out, lse = attention.npu_fused_infer_attention_score(query, key, value,
                                                         softmax_lse_flag=True, **v1)
    sink = learnable_sink.float().view(1, -1, 1)
    out = (out.float() * torch.sigmoid(lse - sink)).to(query.dtype)  # empty rows stay 0
    return out, (torch.logaddexp(lse, sink) if want_lse else torch.zeros(1))


def npu_fused_infer_attention_score_v2_out(query: torch.Tensor, key: torch.Tensor,
                                           value: torch.Tensor, *, out: list[torch.Tensor],
                                           workspace: torch.Tensor | None = None,
                                           **kwargs) -> None:
    """The `.out` variant (graph capture records it): results into out=[attn, lse]."""
    attn, lse = npu_fused_infer_attention_score_v2(query, key, value, **kwargs)
    v1 = _v1_kwargs({k: v for k, v in kwargs.items() if k != "learnable_sink"})
    attention.write_fia_out("npu_fused_infer_attention_score_v2.out", query, v1, attn, lse,
                            out, workspace)


def _npu_fused_infer_attention_score_v2_get_max_workspace(query: torch.Tensor,
                                                          key: torch.Tensor,
                                                          value: torch.Tensor, **kwargs):
    kwargs.pop("learnable_sink", None)
    return attention._npu_fused_infer_attention_score_get_max_workspace(
        query, key, value, **_v1_kwargs(kwargs))
