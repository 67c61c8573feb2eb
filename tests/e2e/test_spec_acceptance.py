"""EAGLE, EAGLE-3 and DeepSeek MTP proposers, three speculative tokens, held to acceptance
counts that do not come from vLLM.

The targets predict from their last three tokens, copied by attention heads into the
residual stream, which the final hidden state is (vllm_npu/testing/exact_drafts.py). Each
method gets three drafts built to compute a known function:

  * equal, the target's own: every draft token is accepted (accepted == drafted). The
    draft takes the token before its input from the hidden state it is passed, the one
    before that from the input token its KV cache holds 2 positions back, and its input
    through a self head: this needs the proposer to shift the input ids by one, pass the
    target's hidden states and then its own, write and advance the draft positions, slots
    and sequence lengths at every step, and feed its own tokens back;
  * wrong, the target's argmin: no draft token is accepted;
  * partial, another three-token function: the drafted and accepted counts are those of
    greedy speculative decoding simulated here in plain PyTorch (every step accepts a
    prefix, so the proposer's handling of rejected tokens decides the next proposals).

Verification keeps the tokens equal to HF's greedy tokens of the target. The engines run
vLLM's default graph mode (FULL_DECODE_ONLY), float32 on the simulated NPU.
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.helpers.engine import generate, make_llm, metric, shutdown, vocab
from tests.helpers.reference import _model, hf_greedy, random_prompt
from vllm_npu.compilation.acl_graph import ACLGraphWrapper
from vllm_npu.testing.exact_drafts import KINDS, SLOT

K = 3  # speculative tokens
MAX_TOKENS = 24
# 4+ tokens (vLLM zeroes the MTP embedding at position 0); 77 is prefilled in two chunks
PROMPT_LENGTHS = (4, 11, 30, 77)
CASES = [(method, kind) for method in ("eagle", "eagle3", "mtp") for kind in KINDS]


@pytest.fixture(scope="module")
def exact_models(tmp_path_factory) -> dict:
    """(method, kind) -> (engine path, speculative model or None, HF reference path)."""
    from vllm_npu.testing.exact_drafts import (add_exact_mtp_layer, build_exact_eagle_draft,
                                               build_three_token_target)

    root = tmp_path_factory.mktemp("exact-spec")
    llama = build_three_token_target(str(root / "llama"), "llama")
    dsv3 = build_three_token_target(str(root / "dsv3"), "deepseek_v3")
    models = {}
    for kind in KINDS:
        for method in ("eagle", "eagle3"):
            draft = build_exact_eagle_draft(str(root / f"{method}-{kind}"), llama, method, kind)
            models[method, kind] = (llama, draft, llama)
        with_mtp = str(root / f"dsv3-mtp-{kind}")
        shutil.copytree(dsv3, with_mtp)
        models["mtp", kind] = (add_exact_mtp_layer(with_mtp, kind), None, dsv3)
    return models


def _prompts(n: int) -> list[list[int]]:
    return [random_prompt(500 + i, length, n) for i, length in enumerate(PROMPT_LENGTHS)]


def _simulate(reference: str, kind: str, prompts: list[list[int]]):
    """Greedy speculative decoding in plain PyTorch, from the target checkpoint's embedding
    and lm_head: the target's logits read slots (0, 1, 2) = the last three tokens'
    embeddings, an equal draft's the same, a wrong one's their negation, a partial one's
    slots (0, 1, 3). Each step proposes K tokens, accepts the prefix the target agrees
    with, and adds the target's next token (the prefill step adds one). Returns the
    tokens, the drafted and the accepted counts."""
    from safetensors.torch import load_file

    weights = load_file(os.path.join(reference, "model.safetensors"))
    embed = weights["model.embed_tokens.weight"][:, :SLOT].double()
    head = weights["lm_head.weight"].double()

    def logits(context: list[int], slots: tuple[int, ...]) -> torch.Tensor:
        return sum(head[:, SLOT * s:SLOT * (s + 1)] @ embed[context[-1 - back]]
                   for back, s in enumerate(slots))

    def target(context):
        return int(logits(context, (0, 1, 2)).argmax())

    def draft(context):
        if kind == "partial":
            return int(logits(context, (0, 1, 3)).argmax())
        return int(logits(context, (0, 1, 2)).argmin()) if kind == "wrong" else target(context)

    outputs, drafted, accepted = [], 0, 0
    for prompt in prompts:
        context = prompt + [target(prompt)]
        while len(context) - len(prompt) < MAX_TOKENS:
            proposals = []
            for _ in range(K):
                proposals.append(draft(context + proposals))
            n = 0
            while n < K and proposals[n] == target(context + proposals[:n]):
                n += 1
            context += proposals[:n] + [target(context + proposals[:n])]
            drafted, accepted = drafted + K, accepted + n
        outputs.append(context[len(prompt):len(prompt) + MAX_TOKENS])
    return outputs, drafted, accepted


@pytest.fixture(scope="module", params=CASES, ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, exact_models, float32_only):
    # exact acceptance counts: in another dtype a rounding could flip a near tie between
    # draft and target
    method, kind = request.param
    path, draft, reference = exact_models[request.param]
    config = {"method": method, "num_speculative_tokens": K}
    if draft is not None:
        config["model"] = draft
    # one sequence per prompt: fewer decode graphs to capture
    llm = make_llm(path, float32_only, max_num_seqs=len(PROMPT_LENGTHS),
                   speculative_config=config)
    yield method, kind, reference, llm
    shutdown(llm)


def test_acceptance_is_what_the_draft_construction_implies(engine):
    method, kind, reference, llm = engine
    prompts = _prompts(vocab(reference))
    drafts0 = metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = metric(llm, "vllm:spec_decode_num_accepted_tokens")
    replays0 = ACLGraphWrapper.stats.replays
    got = generate(llm, prompts, MAX_TOKENS)
    replays = ACLGraphWrapper.stats.replays - replays0
    drafts = metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0
    accepted = metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0
    assert got == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    assert replays > 0, "uniform spec-decode batches should replay FULL graphs"
    tokens, want_drafts, want_accepted = _simulate(reference, kind, prompts)
    assert tokens == got  # the simulation's target is HF's
    if kind == "equal":
        assert accepted == drafts, f"{method}: {accepted:g} of {drafts:g} drafts accepted"
    elif kind == "wrong":
        assert accepted == 0, f"{method}: {accepted:g} of {drafts:g} wrong drafts accepted"
    else:
        assert 0 < want_accepted < want_drafts  # steps accept some drafts, reject others
    assert (accepted, drafts) == (want_accepted, want_drafts), method


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_targets_copy_the_two_previous_tokens(exact_models, arch):
    """The construction's premises, checked in HF: the copying heads' attention weights
    are exactly one-hot at distance 1 and 2 (from position 2 on), the final hidden state
    has RMS sqrt(3) everywhere (so it is the residual itself), and both earlier tokens
    change the prediction (so a draft that reads a wrong hidden state or a wrong position
    of its KV cache proposes other tokens)."""
    reference = exact_models["eagle" if arch == "llama" else "mtp", "equal"][2]
    model = _model(reference)
    n = model.config.vocab_size
    ids = torch.tensor([random_prompt(7, 50, n)])
    with torch.inference_mode():
        before = model.config._attn_implementation
        model.config._attn_implementation = "eager"  # the one that returns its weights
        try:
            out = model(ids, output_attentions=True, output_hidden_states=True)
        finally:
            model.config._attn_implementation = before
        heads = {1: 1, 2: 2} if arch == "llama" else {0: 1, 1: 2}
        for head, distance in heads.items():
            weights = out.attentions[0][0, head, 2:]
            expected = torch.zeros_like(weights)
            expected[torch.arange(48), torch.arange(2 - distance, 50 - distance)] = 1.0
            assert torch.equal(weights, expected), head
        rms = out.hidden_states[-1][0].pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.full_like(rms, 3 ** 0.5))
        tokens = torch.randint(2, n, (256, 3), generator=torch.Generator().manual_seed(0))
        base = model(tokens).logits[:, -1].argmax(-1)
        for back in (1, 2):
            other = tokens.clone()
            other[:, 2 - back] = tokens[:, 2 - back].roll(1)
            changed = model(other).logits[:, -1].argmax(-1) != base
            assert changed.float().mean() > 0.5, back
