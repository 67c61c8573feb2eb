"""Dense TND calls of `npu_fused_infer_attention_score` (no block table, no rope): MLA
prefill and the DCP new-token call.

That form takes query/key/value head dims (128, 128, 128), or (192, 192, 128), or (192,
192, 192) without grouped heads, in bfloat16 (ops/sim/fia_shapes.py cites the documents
and kernel checks). Other head dims are zero-padded to the smallest form that holds them
(zeros in q and k leave every score unchanged, zeros in v only add output columns that are
dropped), and float16 runs in bfloat16, as vllm-ascend's MLA prefill does ("FIA with TND
layout only supports bfloat16, convert if needed", mla_v1.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_npu.ops.sim.fia_shapes import DENSE_TND_DIMS


def padded_dims(qk_dim: int, v_dim: int, grouped: bool) -> tuple[int, int]:
    """The smallest (query/key, value) head dims of the dense TND form that hold these."""
    for qk, v in DENSE_TND_DIMS:
        if qk_dim <= qk and v_dim <= v and not (v == 192 and grouped):
            return qk, v
    raise ValueError(f"head dims ({qk_dim}, {v_dim}){' with grouped heads' if grouped else ''}"
                     f" fit no dense TND form of the fused attention op: {DENSE_TND_DIMS}")


def run_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == torch.float16 else dtype


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q [T, N, Dqk], k [Tkv, Hkv, Dqk], v [Tkv, Hkv, Dv] -> the same, padded and in the
    dtype the op takes, contiguous."""
    qk, dv = padded_dims(q.shape[-1], v.shape[-1], q.shape[1] != k.shape[1])
    dtype = run_dtype(q.dtype)
    q, k = (F.pad(t, (0, qk - t.shape[-1])) if t.shape[-1] != qk else t for t in (q, k))
    v = F.pad(v, (0, dv - v.shape[-1])) if v.shape[-1] != dv else v
    return tuple(t.to(dtype).contiguous() for t in (q, k, v))
