"""The batched replacements of vLLM's speculative-decoding Triton kernels vs per-request
loops written from the kernels' documented semantics (vllm/v1/sample/rejection_sampler.py,
vllm/v1/spec_decode/utils.py)."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.spec_decode import eagle_kernels as ek
from vllm_npu.spec_decode import rejection_kernels as rk

PLACEHOLDER = -1


def _batch(seed: int, batch: int, max_spec: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_spec + 1, (batch,), generator=g)
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n = int(cu[-1])
    target_argmax = torch.randint(0, vocab, (n,), generator=g)
    # about half of the drafts agree with the target
    agree = torch.rand(n, generator=g) < 0.6
    draft = torch.where(agree, target_argmax, torch.randint(0, vocab, (n,), generator=g))
    bonus = torch.randint(0, vocab, (batch, 1), generator=g)
    return counts.tolist(), cu, draft.to(torch.int32), target_argmax, bonus, g


def _greedy_reference(counts, draft, target, bonus, max_spec, rows):
    out = torch.full((len(counts), max_spec + 1), PLACEHOLDER, dtype=torch.int32)
    start = 0
    for r, n in enumerate(counts):
        if rows[r]:
            rejected = False
            for p in range(n):
                out[r, p] = int(target[start + p])
                if int(draft[start + p]) != int(target[start + p]):
                    rejected = True
                    break
            if not rejected:
                out[r, n] = int(bonus[r, 0])
        start += n
    return out


@pytest.mark.parametrize("seed", range(4))
def test_greedy_rejection_matches_loop(seed):
    counts, cu, draft, target, bonus, g = _batch(seed, batch=9, max_spec=4, vocab=11)
    is_greedy = torch.rand(9, generator=g) < 0.7
    for greedy_rows in (None, is_greedy):
        out = torch.full((9, 5), PLACEHOLDER, dtype=torch.int32)
        rk.rejection_greedy_sample_kernel(out, cu, draft, target, bonus, greedy_rows, 4,
                                          None, None, SYNTHETIC_MODE=False)
        rows = [True] * 9 if greedy_rows is None else greedy_rows.tolist()
        assert torch.equal(out, _greedy_reference(counts, draft, target, bonus, 4, rows))


def test_greedy_rejection_without_drafts_takes_bonus():
    out = torch.full((3, 4), PLACEHOLDER, dtype=torch.int32)
    bonus = torch.tensor([[5], [6], [7]])
    rk.rejection_greedy_sample_kernel(out, torch.zeros(3, dtype=torch.int32),
                                      torch.empty(0, dtype=torch.int32),
                                      torch.empty(0, dtype=torch.long), bonus, None, 3,
                                      None, None)
    assert out[:, 0].tolist() == [5, 6, 7] and (out[:, 1:] == PLACEHOLDER).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_random_rejection_matches_loop(seed, with_draft_probs):
    batch, max_spec, vocab = 7, 3, 13
    counts, cu, draft, _, bonus, g = _batch(seed, batch, max_spec, vocab)
    n = int(cu[-1])
    target_probs = torch.softmax(torch.randn(n, vocab, generator=g), -1)
    draft_probs = torch.softmax(torch.randn(n, vocab, generator=g), -1) \
        if with_draft_probs else None
    recovered = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
    uniform = torch.rand(n, generator=g, dtype=torch.float64)
    is_greedy = torch.rand(batch, generator=g) < 0.3
    if n:
        draft[0] = -1  # a padded draft is always rejected
    out = torch.full((batch, max_spec + 1), PLACEHOLDER, dtype=torch.int32)
    rk.rejection_random_sample_kernel(out, cu, draft, draft_probs, target_probs, bonus,
                                      recovered, uniform, is_greedy, max_spec, vocab, None,
                                      NO_DRAFT_PROBS=draft_probs is None)
    want = torch.full_like(out, PLACEHOLDER)
    start = 0
    for r, k in enumerate(counts):
        if not is_greedy[r]:
            rejected = False
            for p in range(k):
                t, d = start + p, int(draft[start + p])
                if d < 0:
                    ok = False
                else:
                    q = 1.0 if draft_probs is None else float(draft_probs[t, d])
                    ok = q > 0 and float(target_probs[t, d]) / q >= float(uniform[t])
                want[r, p] = d if ok else int(recovered[t])
                if not ok:
                    rejected = True
                    break
            if not rejected:
                want[r, k] = int(bonus[r, 0])
        start += k
    assert torch.equal(out, want)


def test_expand_and_recovered_tokens_match_loop():
    g = torch.Generator().manual_seed(3)
    counts = [2, 0, 3, 1]
    cu = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    temps = torch.tensor([0.5, 0.0, 1.0, 0.0])
    out = torch.full((8,), -5.0)
    rk.expand_kernel(out, temps, cu, 0.0, 1.0, MAX_NUM_TOKENS=16)
    assert out[:6].tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0] and (out[6:] == -5).all()

    vocab, n = 9, sum(counts)
    target = torch.softmax(torch.randn(n, vocab, generator=g), -1)
    drafts = torch.softmax(torch.randn(n, vocab, generator=g), -1)
    draft_ids = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
    inv_q = torch.rand(len(counts), vocab, generator=g) + 0.1
    for draft_probs in (None, drafts):
        got = torch.empty(n, dtype=torch.int32)
        rk.sample_recovered_tokens_kernel(got, cu, draft_ids, draft_probs, target, inv_q,
                                          vocab, NO_DRAFT_PROBS=draft_probs is None)
        req = [r for r, k in enumerate(counts) for _ in range(k)]
        for t in range(n):
            prob = target[t].clone()
            if draft_probs is None:
                prob[int(draft_ids[t])] = 0
            else:
                prob = (prob - draft_probs[t]).clamp(min=0)
            assert int(got[t]) == int(torch.argmax(prob * inv_q[req[t]]))


def test_eagle_prepare_kernels_match_loop():
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)          # drafts 2, 0, 3
    valid = torch.tensor([1, 1, 4], dtype=torch.int32)        # 1 + accepted
    qsl = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    to_sample, rejected = torch.empty(3, dtype=torch.int32), torch.empty(3, dtype=torch.int32)
    ek.eagle_prepare_inputs_padded_kernel(cu, valid, qsl, to_sample, rejected, 3)
    assert rejected.tolist() == [2, 0, 0] and to_sample.tolist() == [0, 3, 7]

    sampled = torch.tensor([[4, -1, -1], [7, 8, -1], [-1, -1, -1], [3, 99, -1]],
                           dtype=torch.int32)  # 99 is outside a vocabulary of 50
    discard = torch.tensor([False, False, False, True])
    backup = torch.tensor([10, 11, 12, 13], dtype=torch.int32)
    nxt, count = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
    ek.eagle_prepare_next_token_padded_kernel(sampled, discard, backup, nxt, count, 50, 3, 4,
                                              3)
    assert nxt.tolist() == [4, 8, 12, 13] and count.tolist() == [1, 2, 0, 0]


def test_eagle_step_slot_mapping_matches_loop():
    block, max_len = 4, 10
    positions = torch.tensor([2, 3, 9])
    table = torch.tensor([[5, 6, 7], [1, 2, 3], [8, 9, 4]], dtype=torch.int32)
    seq = torch.tensor([3, 4, 10], dtype=torch.int32)
    clamped = torch.empty(3, dtype=torch.long)
    slots = torch.full((5,), 77, dtype=torch.long)  # 2 graph-padding rows
    ek.eagle_step_slot_mapping_metadata_kernel(positions, table, 3, seq, clamped, slots,
                                               block, max_len, 3, -1, 3)
    assert clamped.tolist() == [3, 4, 0]
    assert slots.tolist() == [5 * 4 + 3, 2 * 4 + 0, -1, -1, -1]
    assert seq.tolist() == [4, 5, 1]


@pytest.mark.parametrize("shift", [True, False])
def test_copy_and_expand_eagle_inputs_matches_loop(shift):
    # two requests: 3 query tokens (1 rejected), 2 query tokens (none rejected)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    qend = torch.tensor([1, 4], dtype=torch.int32)  # last valid token per request
    tokens = torch.tensor([10, 11, 12, 20, 21], dtype=torch.int32)
    positions = torch.tensor([5, 6, 7, 8, 9])
    bonus = torch.tensor([30, 40], dtype=torch.int32)
    pad_slots, total_in = 2, 5
    size = 16
    outs = dict(ids=torch.full((size,), -9, dtype=torch.int32),
                pos=torch.full((size,), -9, dtype=torch.long),
                rej=torch.zeros(size, dtype=torch.bool), msk=torch.zeros(size, dtype=torch.bool),
                new=torch.full((4,), -9, dtype=torch.int32),
                hid=torch.full((5,), -9, dtype=torch.int32))
    ek.copy_and_expand_eagle_inputs_kernel(tokens, positions, bonus, outs["ids"], outs["pos"],
                                           outs["rej"], outs["msk"], outs["new"], outs["hid"],
                                           qsl, qend, 0, 99, total_in, pad_slots, shift)
    want = {k: v.clone().fill_(-9 if v.dtype != torch.bool else False) for k, v in outs.items()}
    for r in range(2):
        s, nxt, e = int(qsl[r]), int(qsl[r + 1]), int(qend[r])
        nv, off = (e - s, 1) if shift else (e - s + 1, 0)
        start = s + r * (pad_slots - 1 if shift else pad_slots)
        total = nv + pad_slots + (nxt - e - 1)
        for j in range(total):
            o = start + j
            if j < nv:
                tok = int(tokens[min(s + off + j, total_in - 1)])
            elif j == nv:
                tok = int(bonus[r])
            elif j < nv + pad_slots:
                tok = 99
            else:
                tok = 0
            rejected = j >= nv + pad_slots
            want["ids"][o], want["pos"][o] = tok, 0 if rejected else int(positions[s]) + j
            want["rej"][o], want["msk"][o] = rejected, nv < j < nv + pad_slots
            if nv <= j < nv + pad_slots:
                want["new"][r * pad_slots + j - nv] = o
            if shift and j < nxt - s:
                want["hid"][s + j] = o
    for key in outs:
        assert torch.equal(outs[key], want[key]), key
