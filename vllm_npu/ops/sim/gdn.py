"""Simulated Gated DeltaNet kernels (Qwen3-Next, Qwen3.5): the gated delta rule over a
prefill (chunked) and one decode step (recurrent), per request from a state-pool row.

Names and conventions follow what vllm-ascend calls on a 910B (vllm_ascend/ops/gdn.py):
`torch_npu.npu_chunk_gated_delta_rule(q, k, v, beta=, initial_state=,
actual_seq_lengths=, scale=, g=)` for prefills and the AscendC custom op
`npu_recurrent_gated_delta_rule(query, key, value, state, *, beta, scale,
actual_seq_lengths, ssm_state_indices, g)` for decodes, both in TND layout with q and k
L2-normalised by the caller; states [rows, Hv, Dv, Dk] (vLLM's GDN state layout), g the
raw log-decay (float32), beta in (0, 1). Heads: Hv value heads share Hk query/key heads
(Hv % Hk == 0, each key head serves Hv / Hk consecutive value heads).

Per value head, with S [Dv, Dk]:  S <- exp(g_t) S;  u = beta_t (v_t - S k_t);
S <- S + u k_t^T;  o_t = scale * S q_t.
The chunked twin solves each chunk's unit-lower-triangular system for the u's (the WY
form the device kernels use) and passes the state between chunks; the tests check it
against that recurrence step by step.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError, check_dim

CHUNK = 64  # the device kernels' chunk length


def _heads(op: str, query: torch.Tensor, value: torch.Tensor) -> int:
    check_dim(op, "query", query, 3)
    check_dim(op, "value", value, 3)
    hk, hv = query.shape[1], value.shape[1]
    if hv % hk:
        raise NPUOpError(f"{op}: value heads {hv} must be a multiple of key heads {hk}")
    return hv // hk


def _chunk(q, k, v, beta, g, state):
    """One chunk of one request: q/k [L, H, Dk], v [L, H, Dv], beta/g [L, H], state
    [H, Dv, Dk] (float32) -> (out [L, H, Dv], state)."""
    decay = torch.cumsum(g, dim=0)                                   # G_t, [L, H]
    rel = decay.unsqueeze(1) - decay.unsqueeze(0)                    # G_i - G_j
    lower = torch.ones(rel.shape[:2], dtype=torch.bool).tril_().unsqueeze(-1)
    within = torch.exp(rel.masked_fill(~lower, float("-inf")))       # j <= i
    kk = torch.einsum("ihd,jhd->ijh", k, k) * within
    strict = kk.masked_fill(torch.eye(len(g), dtype=torch.bool).unsqueeze(-1), 0.0)
    system = torch.eye(len(g)).unsqueeze(-1) + beta.unsqueeze(1) * strict   # [L, L, H]
    start = torch.exp(decay).unsqueeze(-1)                           # Gamma_t
    rhs = beta.unsqueeze(-1) * (v - start * torch.einsum("hvd,thd->thv", state, k))
    u = torch.linalg.solve_triangular(system.permute(2, 0, 1), rhs.transpose(0, 1),
                                      upper=False, unitriangular=True).transpose(0, 1)
    qk = torch.einsum("ihd,jhd->ijh", q, k) * within
    out = start * torch.einsum("hvd,thd->thv", state, q) + torch.einsum("ijh,jhv->ihv", qk, u)
    tail = torch.exp(decay[-1].unsqueeze(0) - decay).unsqueeze(-1)   # Gamma_L / Gamma_j
    state = state * torch.exp(decay[-1]).view(-1, 1, 1) + \
        torch.einsum("jhv,jhd->hvd", u, k * tail)
    return out, state


def npu_chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                               beta: torch.Tensor, initial_state: torch.Tensor,
                               actual_seq_lengths: list[int], scale: float,
                               g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill: requests back to back (TND), one initial state each [N, Hv, Dv, Dk]; returns
    (out [T, Hv, Dv] in value's dtype, final states [N, Hv, Dv, Dk] float32)."""
    op = "npu_chunk_gated_delta_rule"
    group = _heads(op, query, value)
    if g.dtype != torch.float32:
        raise NPUOpError(f"{op}: g must be float32, got {g.dtype}")
    lengths = list(actual_seq_lengths)
    if sum(lengths) != query.shape[0] or len(lengths) != initial_state.shape[0]:
        raise NPUOpError(f"{op}: actual_seq_lengths {lengths} must cover the {query.shape[0]} "
                         f"tokens with one of the {initial_state.shape[0]} initial states each")
    q = query.float().repeat_interleave(group, dim=1) * scale
    k = key.float().repeat_interleave(group, dim=1)
    v, b = value.float(), beta.float()
    out = torch.empty(value.shape, dtype=torch.float32)
    finals = initial_state.float().clone()
    lo = 0
    for i, n in enumerate(lengths):
        state = finals[i]
        for c in range(lo, lo + n, CHUNK):
            end = min(c + CHUNK, lo + n)
            out[c:end], state = _chunk(q[c:end], k[c:end], v[c:end], b[c:end], g[c:end],
                                       state)
        finals[i] = state
        lo += n
    return out.to(value.dtype), finals


def npu_recurrent_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   state: torch.Tensor, *, beta: torch.Tensor, scale: float,
                                   ssm_state_indices: torch.Tensor,
                                   g: torch.Tensor) -> torch.Tensor:
    """Decode: one token per request, q/k [B, Hk, Dk], v [B, Hv, Dv]; the requests' state
    rows are updated in place; rows at vLLM's null block (0, padding) are not written."""
    op = "npu_recurrent_gated_delta_rule"
    group = _heads(op, query, value)
    check_dim(op, "ssm_state_indices", ssm_state_indices, 1)
    rows = ssm_state_indices.long()
    q = query.float().repeat_interleave(group, dim=1) * scale
    k = key.float().repeat_interleave(group, dim=1)
    s = state[rows].float() * torch.exp(g.float()).unsqueeze(-1).unsqueeze(-1)
    u = beta.float().unsqueeze(-1) * (value.float() - torch.einsum("bhvd,bhd->bhv", s, k))
    s = s + u.unsqueeze(-1) * k.unsqueeze(2)
    keep = rows != 0
    state[rows[keep]] = s[keep].to(state.dtype)
    return torch.einsum("bhvd,bhd->bhv", s, q).to(value.dtype)
