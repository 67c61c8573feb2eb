"""Simulated `npu_attention_update` (CANN AttentionUpdate): merge partial attention results
of sp shards of one key sequence into the result over the whole sequence.

    lse[i]       [N] float32      log-sum-exp of shard i's scores, per row (row = token x head)
    local_out[i] [N, D]           shard i's attention output (softmax over its keys only)

    lse_max = max_i lse[i];  lse_m = lse_max + log sum_i exp(lse[i] - lse_max)
    out     = sum_i local_out[i] * exp(lse[i] - lse_m)

update_type 0 returns (out, None); 1 also returns lse_m. A shard without keys for a row has
lse = -inf; callers clamp it to float32's lowest finite value first (the device op takes
finite inputs), which gives that shard weight exp(lowest - lse_m) = 0.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_contiguous, check_dtype

MAX_SP = 16          # sequence-parallel degree the device op takes
HEAD_DIMS = range(8, 513, 8)


def npu_attention_update(lse: list[torch.Tensor], local_out: list[torch.Tensor],
                         update_type: int = 0):
    op = "npu_attention_update"
    sp = len(lse)
    if not 1 <= sp <= MAX_SP or len(local_out) != sp:
        raise NPUOpError(f"{op}: needs 1..{MAX_SP} shards with one lse and one local_out "
                         f"each, got {sp} lse / {len(local_out)} local_out")
    if update_type not in (0, 1):
        raise NPUOpError(f"{op}: update_type={update_type}; valid: 0 (out), 1 (out, lse)")
    n, d = local_out[0].shape if local_out[0].dim() == 2 else (None, None)
    if n is None or d not in HEAD_DIMS:
        raise NPUOpError(f"{op}: local_out must be [N, D] with D a multiple of 8 in 8..512, "
                         f"got {tuple(local_out[0].shape)}")
    for i, (l_i, o_i) in enumerate(zip(lse, local_out)):
        check_dtype(op, f"local_out[{i}]", o_i)
        check_dtype(op, f"lse[{i}]", l_i, (torch.float32,))
        check_contiguous(op, **{f"lse[{i}]": l_i, f"local_out[{i}]": o_i})
        if tuple(o_i.shape) != (n, d) or tuple(l_i.shape) != (n,) \
                or o_i.dtype != local_out[0].dtype:
            raise NPUOpError(f"{op}: shard {i} has lse {tuple(l_i.shape)} / local_out "
                             f"{tuple(o_i.shape)} {o_i.dtype}; expected ({n},) / ({n}, {d}) "
                             f"{local_out[0].dtype}")
        if not torch.isfinite(l_i).all():
            raise NPUOpError(f"{op}: lse[{i}] has non-finite entries; clamp empty shards to "
                             "torch.finfo(torch.float32).min")
    lses = torch.stack(lse)                                   # [sp, N]
    lse_m = torch.logsumexp(lses, dim=0)                      # [N]
    weights = torch.exp(lses - lse_m).unsqueeze(-1)           # [sp, N, 1]
    out = (torch.stack(local_out).float() * weights).sum(0).to(local_out[0].dtype)
    return out, (lse_m if update_type == 1 else None)
