"""The simulated Gated DeltaNet ops against the delta rule written here token by token,
head by head, with the state as Dk x Dv (the transpose of the ops' layout): prompts
longer than a chunk, several requests per call, a prefill split in two (the state
carried through the pool) followed by decode steps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import gdn
from vllm_npu.ops.sim.checks import NPUOpError

HK, HV, DK, DV = 2, 4, 8, 6
SCALE = DK ** -0.5


def _reference(q, k, v, beta, g, state):
    """q/k [T, HK, DK], v [T, HV, DV]; state [HV, DK, DV] -> (out [T, HV, DV], state)."""
    out = torch.empty(q.shape[0], HV, DV)
    state = state.clone()
    for t in range(q.shape[0]):
        for h in range(HV):
            kh, qh = k[t, h // (HV // HK)], q[t, h // (HV // HK)]
            s = state[h] * torch.exp(g[t, h])
            error = v[t, h] - kh @ s               # what the memory recalls for k
            s = s + beta[t, h] * torch.outer(kh, error)
            out[t, h] = SCALE * (qh @ s)
            state[h] = s
    return out, state


def _inputs(tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=F.normalize(r(tokens, HK, DK), dim=-1), k=F.normalize(r(tokens, HK, DK), dim=-1),
                v=r(tokens, HV, DV), beta=torch.sigmoid(r(tokens, HV)),
                g=-F.softplus(r(tokens, HV)) * 0.3)


def _ops_state(dk_dv: torch.Tensor) -> torch.Tensor:
    return dk_dv.transpose(-1, -2).contiguous()  # [.., DV, DK]


@pytest.mark.parametrize("lengths", [[150, 3, 64], [1], [65, 130]])
def test_chunked_prefill_matches_the_delta_rule(lengths):
    inp = _inputs(sum(lengths))
    gen = torch.Generator().manual_seed(5)
    starts = torch.randn(len(lengths), HV, DK, DV, generator=gen) * 0.3
    out, finals = gdn.npu_chunk_gated_delta_rule(
        inp["q"], inp["k"], inp["v"], beta=inp["beta"], initial_state=_ops_state(starts),
        actual_seq_lengths=lengths, scale=SCALE, g=inp["g"])
    lo = 0
    for i, n in enumerate(lengths):
        want, state = _reference(*(inp[x][lo:lo + n] for x in ("q", "k", "v", "beta", "g")),
                                 starts[i])
        torch.testing.assert_close(out[lo:lo + n], want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(finals[i], _ops_state(state), rtol=1e-4, atol=1e-4)
        lo += n


def test_split_prefill_then_decode_carries_the_state():
    inp = _inputs(100, seed=2)
    want, _ = _reference(*(inp[x] for x in ("q", "k", "v", "beta", "g")),
                         torch.zeros(HV, DK, DV))
    pool = torch.zeros(4, HV, DV, DK)
    got = []
    for lo, hi in ((0, 70), (70, 97)):
        part = {x: t[lo:hi] for x, t in inp.items()}
        out, finals = gdn.npu_chunk_gated_delta_rule(
            part["q"], part["k"], part["v"], beta=part["beta"], initial_state=pool[3:4],
            actual_seq_lengths=[hi - lo], scale=SCALE, g=part["g"])
        pool[3] = finals[0]
        got.append(out)
    for t in range(97, 100):
        step = {x: v[t:t + 1] for x, v in inp.items()}
        got.append(gdn.npu_recurrent_gated_delta_rule(
            step["q"], step["k"], step["v"], pool, beta=step["beta"], scale=SCALE,
            ssm_state_indices=torch.tensor([3], dtype=torch.int32), g=step["g"]))
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)
    assert not pool[:3].any(), "rows of other requests were written"


def test_refusals_name_the_bad_value():
    inp = _inputs(4)
    with pytest.raises(NPUOpError, match="value heads 3 must be a multiple of key heads 2"):
        gdn.npu_recurrent_gated_delta_rule(inp["q"], inp["k"], torch.zeros(4, 3, DV),
                                           torch.zeros(5, 3, DV, DK), beta=inp["beta"],
                                           scale=SCALE, ssm_state_indices=torch.arange(4),
                                           g=inp["g"])
    with pytest.raises(NPUOpError, match="g must be float32"):
        gdn.npu_chunk_gated_delta_rule(inp["q"], inp["k"], inp["v"], beta=inp["beta"],
                                       initial_state=torch.zeros(1, HV, DV, DK),
                                       actual_seq_lengths=[4], scale=SCALE,
                                       g=inp["g"].half())
