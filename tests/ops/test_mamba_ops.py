"""The simulated Mamba-2 ops against a step-by-step recurrence written here, token by
token: the conv as a sliding dot product over a kept window, the SSM as
h_t = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T, y_t = C_t h_t + D x_t. Prompts cross chunk
boundaries, and a prompt split into two prefills (chunked prefill) carries its state."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import mamba
from vllm_npu.ops.sim.checks import NPUOpError

DIM, WIDTH, HEADS, HEAD_DIM, GROUPS, STATE = 12, 4, 4, 8, 2, 6


def _conv_reference(x, weight, bias, window):
    """x [T, D]; window [D, W-1] (oldest first) -> outputs [T, D], final window."""
    outs = []
    for t in range(x.shape[0]):
        full = torch.cat((window, x[t].unsqueeze(-1)), dim=-1)
        outs.append(F.silu((full * weight).sum(-1) + bias))
        window = full[:, 1:]
    return torch.stack(outs), window


def _ssm_reference(x, dt, A, B, C, D, dt_bias, state):
    """x [T, H, P], dt [T, H], B/C [T, G, N]; state [H, P, N]."""
    per_group = HEADS // GROUPS
    ys = []
    for t in range(x.shape[0]):
        y_t = torch.empty(HEADS, HEAD_DIM)
        new = torch.empty_like(state)
        for h in range(HEADS):
            g = h // per_group
            step = F.softplus(dt[t, h] + dt_bias[h])
            new[h] = torch.exp(step * A[h]) * state[h] + \
                step * torch.outer(x[t, h], B[t, g])
            y_t[h] = new[h] @ C[t, g] + D[h] * x[t, h]
        state = new
        ys.append(y_t)
    return torch.stack(ys), state


def _inputs(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(x=r(tokens, HEADS, HEAD_DIM), dt=r(tokens, HEADS) * 0.5,
                B=r(tokens, GROUPS, STATE), C=r(tokens, GROUPS, STATE))


PARAMS = dict(A=-torch.linspace(0.2, 1.5, HEADS), D=torch.linspace(0.5, 1.0, HEADS),
              dt_bias=torch.linspace(-0.5, 0.5, HEADS))


@pytest.mark.parametrize("lengths,chunk", [([5, 37, 16], 8), ([40], 16), ([1, 3], 4)])
def test_chunk_scan_matches_the_recurrence(lengths, chunk):
    total = sum(lengths)
    inp = _inputs(total)
    ends = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    g = torch.Generator().manual_seed(7)
    starts = torch.randn(len(lengths), HEADS, HEAD_DIM, STATE, generator=g)
    out = torch.empty(total, HEADS, HEAD_DIM)
    finals = mamba.npu_mamba_chunk_scan(inp["x"], inp["dt"], PARAMS["A"], inp["B"], inp["C"],
                                       chunk, PARAMS["D"], PARAMS["dt_bias"], ends, starts,
                                       True, out)
    for i, (lo, hi) in enumerate(zip(ends[:-1].tolist(), ends[1:].tolist())):
        want, state = _ssm_reference(*(inp[k][lo:hi] for k in ("x", "dt")), PARAMS["A"],
                                     inp["B"][lo:hi], inp["C"][lo:hi], PARAMS["D"],
                                     PARAMS["dt_bias"], starts[i])
        torch.testing.assert_close(out[lo:hi], want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(finals[i], state, rtol=1e-4, atol=1e-4)


def test_prefill_in_two_chunks_then_decode_carries_the_state():
    """One prompt as two prefills (state handed over through the pool) and two decode
    steps through the state-update op equals the recurrence over all tokens."""
    inp = _inputs(23, seed=3)
    want, _ = _ssm_reference(inp["x"], inp["dt"], PARAMS["A"], inp["B"], inp["C"],
                             PARAMS["D"], PARAMS["dt_bias"],
                             torch.zeros(HEADS, HEAD_DIM, STATE))
    pool = torch.zeros(3, HEADS, HEAD_DIM, STATE)
    got = []
    for lo, hi in ((0, 13), (13, 21)):
        out = torch.empty(hi - lo, HEADS, HEAD_DIM)
        start = pool[2:3] if lo else None
        finals = mamba.npu_mamba_chunk_scan(
            inp["x"][lo:hi], inp["dt"][lo:hi], PARAMS["A"], inp["B"][lo:hi],
            inp["C"][lo:hi], 8, PARAMS["D"], PARAMS["dt_bias"],
            torch.tensor([0, hi - lo], dtype=torch.int32), start, True, out)
        pool[2] = finals[0]
        got.append(out)
    for t in (21, 22):
        out = torch.empty(1, HEADS, HEAD_DIM)
        mamba.npu_selective_state_update(pool, inp["x"][t:t + 1], inp["dt"][t:t + 1],
                                         PARAMS["A"], inp["B"][t:t + 1], inp["C"][t:t + 1],
                                         PARAMS["D"], PARAMS["dt_bias"], True,
                                         torch.tensor([2]), out)
        got.append(out)
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)
    assert not pool[:2].any(), "rows of other requests were written"


def test_conv_prefill_and_update_match_the_sliding_window():
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)
    x = torch.randn(19, DIM, generator=g)
    initial = torch.randn(DIM, WIDTH - 1, generator=g)
    want_a, window_a = _conv_reference(x[:9], weight, bias, torch.zeros(DIM, WIDTH - 1))
    want_b, window_b = _conv_reference(x[9:], weight, bias, initial)
    states = torch.zeros(4, DIM, WIDTH - 1)
    states[3] = initial
    out = mamba.npu_causal_conv1d(x.t().contiguous(), weight, bias, states,
                                  torch.tensor([0, 9, 19], dtype=torch.int32),
                                  torch.tensor([1, 3], dtype=torch.int32),
                                  torch.tensor([False, True]), "silu").t()
    torch.testing.assert_close(out, torch.cat((want_a, want_b)))
    torch.testing.assert_close(states[1], window_a)
    torch.testing.assert_close(states[3], window_b)
    # one decode step each, a padding row (null block 0) left untouched
    step = torch.randn(3, DIM, generator=g)
    outs = mamba.npu_causal_conv1d_update(step, states, weight, bias, "silu",
                                          torch.tensor([1, 0, 3]))
    for row, (slot, window) in enumerate(((1, window_a), (3, window_b))):
        want, after = _conv_reference(step[2 * row:2 * row + 1], weight, bias, window)
        torch.testing.assert_close(outs[2 * row], want[0])
        torch.testing.assert_close(states[slot], after)
    assert not states[0].any()


def test_refusals_name_the_bad_value():
    weight = torch.zeros(DIM, 5)
    with pytest.raises(NPUOpError, match="conv width 5 is not supported; valid: 2, 3, 4"):
        mamba.npu_causal_conv1d_update(torch.zeros(1, DIM), torch.zeros(2, DIM, 4), weight,
                                       None, "silu", torch.tensor([1]))
    inp = _inputs(4)
    with pytest.raises(NPUOpError, match="4 heads do not split into 3 groups"):
        mamba.npu_mamba_chunk_scan(inp["x"], inp["dt"], PARAMS["A"],
                                   torch.zeros(4, 3, STATE), torch.zeros(4, 3, STATE), 8,
                                   None, None, torch.tensor([0, 4]), None, True,
                                   torch.empty(4, HEADS, HEAD_DIM))


def test_batch_memcpy_copies_each_range_by_address():
    """vLLM's align-mode state copies (worker/state_copy.py): (src, dst, bytes) triples."""
    from vllm_npu.ops.sim.state_copy import npu_batch_memcpy

    src = torch.arange(40, dtype=torch.float32)
    dst = torch.zeros(40)
    size = src.element_size()
    ptrs = lambda t, idx: torch.tensor([t.data_ptr() + i * size for i in idx])  # noqa: E731
    npu_batch_memcpy(ptrs(src, [0, 30]), ptrs(dst, [10, 0]), torch.tensor([5 * size, size]))
    want = torch.zeros(40)
    want[10:15], want[0] = src[0:5], src[30]
    assert torch.equal(dst, want)
    with pytest.raises(NPUOpError, match="must be 1-D of one length"):
        npu_batch_memcpy(ptrs(src, [0]), ptrs(dst, [0, 1]), torch.tensor([4]))
