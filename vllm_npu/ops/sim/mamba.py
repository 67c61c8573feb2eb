"""Simulated Mamba-2 kernels: the causal depthwise conv1d with its rolling state, the SSD
(state-space duality) chunk scan for prefill and the selective-state update for decode.

A 910B runs these as Triton-Ascend kernels with the argument conventions of vLLM's own
Triton kernels (vllm/model_executor/layers/mamba/ops/: causal_conv1d.py, ssd_combined.py,
ssu_dispatch.py): varlen batches by `query_start_loc` / `cu_seqlens`, per-request states
addressed by indices into a state pool (a state-pool row is one KV-cache block), updated
in place; an index equal to the null block (0) marks a padding row, skipped. The twins
here are plain PyTorch: the SSD scan in its chunked form (quadratic within a chunk, a
state passed between chunks), which the tests check against a step-by-step recurrence.

Shapes (T tokens, S requests, D conv channels, W conv width, H heads, P head dim,
G groups, N state size):
    conv states  [pool, D, W-1]        ssm states [pool, H, P, N]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_npu.ops.sim.checks import NPUOpError, check_dim

NULL_BLOCK = 0  # vLLM's null block: state rows of padding requests point here


def _check_width(op: str, weight: torch.Tensor, states: torch.Tensor) -> int:
    check_dim(op, "weight", weight, 2)
    width = weight.shape[1]
    if not 2 <= width <= 4:  # the causal-conv1d kernels' template widths
        raise NPUOpError(f"{op}: conv width {width} is not supported; valid: 2, 3, 4")
    if states.shape[-2:] != (weight.shape[0], width - 1):
        raise NPUOpError(f"{op}: conv states {tuple(states.shape)} do not hold "
                         f"[..., {weight.shape[0]}, {width - 1}] for weight "
                         f"{tuple(weight.shape)}")
    return width


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in ("silu", "swish"):
        return F.silu(y)
    if activation is not None:
        raise NPUOpError(f"causal_conv1d: activation={activation!r}; valid: None, 'silu'")
    return y


def npu_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      conv_states: torch.Tensor, query_start_loc: torch.Tensor,
                      cache_indices: torch.Tensor, has_initial_state: torch.Tensor | None,
                      activation: str | None = "silu") -> torch.Tensor:
    """Prefill: x [D, T] (requests back to back) -> out [D, T]. Each request starts from
    its conv state (zeros without one) and leaves its last W-1 inputs there."""
    op = "npu_causal_conv1d"
    check_dim(op, "x", x, 2)
    width = _check_width(op, weight, conv_states)
    ends = query_start_loc.tolist()
    rows = cache_indices.tolist()
    starts = has_initial_state.tolist() if has_initial_state is not None else [False] * len(rows)
    out = torch.empty_like(x)
    kernel = weight.unsqueeze(1)
    for i, (lo, hi) in enumerate(zip(ends[:-1], ends[1:])):
        if hi == lo or rows[i] == NULL_BLOCK:
            continue
        state = conv_states[rows[i]]
        head = state if starts[i] else torch.zeros_like(state)
        seq = torch.cat((head.to(x.dtype), x[:, lo:hi]), dim=1)
        y = F.conv1d(seq.unsqueeze(0), kernel, bias, groups=x.shape[0])[0]
        out[:, lo:hi] = _activate(y, activation)
        state.copy_(seq[:, -(width - 1):])
    return out


def npu_causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None, activation: str | None,
                             conv_state_indices: torch.Tensor) -> torch.Tensor:
    """Decode: one new input per request, x [S, D] -> out [S, D]; the state rolls by one."""
    op = "npu_causal_conv1d_update"
    check_dim(op, "x", x, 2)
    _check_width(op, weight, conv_state)
    check_dim(op, "conv_state_indices", conv_state_indices, 1)
    rows = conv_state_indices.long()
    keep = rows != NULL_BLOCK
    window = torch.cat((conv_state[rows].to(x.dtype), x.unsqueeze(-1)), dim=-1)  # [S, D, W]
    y = (window * weight).sum(-1)
    if bias is not None:
        y = y + bias
    conv_state[rows[keep]] = window[keep, :, 1:].to(conv_state.dtype)
    return _activate(y, activation)


def _step_sizes(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool) -> torch.Tensor:
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    return F.softplus(dt) if softplus else dt


def _check_heads(op: str, heads: int, groups: int) -> None:
    if groups <= 0 or heads % groups:
        raise NPUOpError(f"{op}: {heads} heads do not split into {groups} groups")


def _scan_one(x, dt, a, b, c, chunk: int, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: x [T, H, P], dt [T, H] (after softplus), a [H], b/c [T, H, N] (groups
    expanded), state [H, P, N] float32 -> (y [T, H, P], final state)."""
    ys = []
    for lo in range(0, x.shape[0], chunk):
        xs, dts = x[lo:lo + chunk].float(), dt[lo:lo + chunk]
        bs, cs = b[lo:lo + chunk].float(), c[lo:lo + chunk].float()
        decay = torch.cumsum(dts * a, dim=0)                      # [L, H] log-decay to t
        seg = decay.unsqueeze(1) - decay.unsqueeze(0)             # [Li, Lj, H]
        causal = torch.ones(seg.shape[:2], dtype=torch.bool).tril_().unsqueeze(-1)
        weights = torch.exp(seg.masked_fill(~causal, float("-inf")))  # exp(A_i - A_j), j<=i
        scores = torch.einsum("ihn,jhn->ijh", cs, bs) * weights * dts.unsqueeze(0)
        y = torch.einsum("ijh,jhp->ihp", scores, xs)
        y = y + torch.einsum("ihn,hpn->ihp", cs, state) * torch.exp(decay).unsqueeze(-1)
        ys.append(y)
        last = decay[-1]
        carry = torch.exp(last.unsqueeze(0) - decay) * dts        # [L, H]
        state = state * torch.exp(last).view(-1, 1, 1) + \
            torch.einsum("jh,jhp,jhn->hpn", carry, xs, bs)
    return torch.cat(ys), state


def npu_mamba_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, chunk_size: int, D: torch.Tensor | None,
                         dt_bias: torch.Tensor | None, cu_seqlens: torch.Tensor,
                         initial_states: torch.Tensor | None, dt_softplus: bool,
                         out: torch.Tensor) -> torch.Tensor:
    """Prefill SSD scan: x [T, H, P], dt [T, H], A [H], B/C [T, G, N] -> out [T, H, P]
    (written), returns each request's final state [S, H, P, N] (float32)."""
    op = "npu_mamba_chunk_scan"
    check_dim(op, "x", x, 3)
    heads, groups = x.shape[1], B.shape[1]
    _check_heads(op, heads, groups)
    if chunk_size <= 0:
        raise NPUOpError(f"{op}: chunk_size={chunk_size} must be positive")
    step = _step_sizes(dt, dt_bias, dt_softplus)
    b = B.repeat_interleave(heads // groups, dim=1)
    c = C.repeat_interleave(heads // groups, dim=1)
    ends = cu_seqlens.tolist()
    finals = x.new_zeros(len(ends) - 1, heads, x.shape[2], B.shape[2], dtype=torch.float32)
    a = A.float()
    for i, (lo, hi) in enumerate(zip(ends[:-1], ends[1:])):
        start = finals[i] if initial_states is None else initial_states[i].float()
        if hi == lo:
            finals[i] = start
            continue
        y, finals[i] = _scan_one(x[lo:hi], step[lo:hi], a, b[lo:hi], c[lo:hi], chunk_size,
                                 start)
        if D is not None:
            y = y + x[lo:hi].float() * D.float().view(-1, 1)
        out[lo:hi] = y.to(out.dtype)
    return finals


def npu_selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                               A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                               D: torch.Tensor | None, dt_bias: torch.Tensor | None,
                               dt_softplus: bool, state_batch_indices: torch.Tensor,
                               out: torch.Tensor) -> None:
    """Decode: one token per request. x [S, H, P], dt [S, H], A [H], B/C [S, G, N];
    state rows [pool, H, P, N] updated in place, out [S, H, P] written."""
    op = "npu_selective_state_update"
    check_dim(op, "x", x, 3)
    heads, groups = x.shape[1], B.shape[1]
    _check_heads(op, heads, groups)
    check_dim(op, "state_batch_indices", state_batch_indices, 1)
    rows = state_batch_indices.long()
    keep = rows != NULL_BLOCK
    step = _step_sizes(dt, dt_bias, dt_softplus)                  # [S, H]
    b = B.repeat_interleave(heads // groups, dim=1).float()        # [S, H, N]
    c = C.repeat_interleave(heads // groups, dim=1).float()
    h = state[rows].float() * torch.exp(step * A.float()).unsqueeze(-1).unsqueeze(-1)
    h = h + (step.unsqueeze(-1) * x.float()).unsqueeze(-1) * b.unsqueeze(2)
    y = torch.einsum("shpn,shn->shp", h, c)
    if D is not None:
        y = y + x.float() * D.float().view(-1, 1)
    state[rows[keep]] = h[keep].to(state.dtype)
    out.copy_(y.to(out.dtype))
