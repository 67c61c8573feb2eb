"""The sampling features vLLM users reach for, on the simulated NPU, each against an
independent reference: logprobs and prompt logprobs (top 20) vs HF's log-softmax,
penalties and logit bias vs the same arithmetic in plain PyTorch on HF's logits, beam
search vs HF's `num_beams` search, stop strings vs the unstopped text, seeded sampling and
n > 1 vs seeded repeats, structured output (choice, regex, JSON schema; xgrammar and
guidance) vs validators. One engine per structured-output backend; the first also serves
the other tests (default graph mode)."""
from __future__ import annotations

import functools
import json
import re

import pytest
import torch

from tests.helpers.engine import make_llm, shutdown, vocab
from tests.helpers.reference import _model, random_prompt

TOP = 20


def _engine(path: str, dtype: str, backend: str):
    return make_llm(path, dtype, max_logprobs=TOP,
                    structured_outputs_config={"backend": backend,
                                               "disable_any_whitespace": True})


@pytest.fixture(scope="module")
def engine(tiny_models, float32_only):
    path = tiny_models["llama"]
    llm = _engine(path, float32_only, "xgrammar")
    yield "xgrammar", path, llm
    shutdown(llm)


@functools.cache
def _hf(path: str):
    return _model(path, ())


@torch.inference_mode()
def _log_softmax(path: str, ids: list[int]) -> torch.Tensor:
    """HF's log-softmax over the vocabulary at every position of `ids` [len, V]."""
    return torch.log_softmax(_hf(path)(torch.tensor([ids])).logits[0].float(), dim=-1)


def _prompts(path: str) -> list[list[int]]:
    return [random_prompt(700 + i, n, vocab(path)) for i, n in enumerate((6, 33))]


def _sample(llm, prompts, **kw):
    from vllm import SamplingParams

    return llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(**kw),
                        use_tqdm=False)


def _check_top(got: dict, ref: torch.Tensor, must_hold: int | None = None) -> None:
    """vLLM's {token: Logprob} at one position vs HF's log-softmax row there."""
    values, ids = ref.topk(TOP)
    for token, value in zip(ids.tolist(), values.tolist()):
        assert token in got, (token, sorted(got))
        assert abs(got[token].logprob - value) < 1e-4, (token, got[token].logprob, value)
    ranks = {t: i + 1 for i, t in enumerate(ids.tolist())}
    for token, lp in got.items():
        if token in ranks:
            assert lp.rank == ranks[token]
    if must_hold is not None:
        assert abs(got[must_hold].logprob - float(ref[must_hold])) < 1e-4


def test_logprobs_and_prompt_logprobs_match_hf(engine):
    _, path, llm = engine
    for prompt, out in zip(_prompts(path), _sample(llm, _prompts(path), max_tokens=8,
                                                   temperature=0.0, ignore_eos=True,
                                                   logprobs=TOP, prompt_logprobs=TOP)):
        tokens = list(out.outputs[0].token_ids)
        ref = _log_softmax(path, prompt + tokens)
        for i, step in enumerate(out.outputs[0].logprobs):
            _check_top(step, ref[len(prompt) - 1 + i], must_hold=tokens[i])
        assert out.prompt_logprobs[0] is None
        for j in range(1, len(prompt)):
            _check_top(out.prompt_logprobs[j], ref[j - 1], must_hold=prompt[j])


@torch.inference_mode()
def _penalised_greedy(path, prompt, n, presence=0.0, frequency=0.0, repetition=1.0,
                      bias=None) -> list[int]:
    """Greedy decoding on HF's logits with vLLM's penalty definitions: repetition divides
    positive / multiplies negative logits of every token in prompt or output; frequency
    and presence subtract count * f and (count > 0) * p over the output only; logit bias
    adds."""
    out: list[int] = []
    for _ in range(n):
        logits = _hf(path)(torch.tensor([prompt + out])).logits[0, -1].float()
        seen = torch.zeros_like(logits, dtype=torch.bool)
        seen[torch.tensor(prompt + out)] = True
        logits = torch.where(seen, torch.where(logits > 0, logits / repetition,
                                               logits * repetition), logits)
        counts = torch.zeros_like(logits)
        if out:
            counts.index_add_(0, torch.tensor(out), torch.ones(len(out)))
        logits = logits - frequency * counts - presence * (counts > 0).float()
        for token, value in (bias or {}).items():
            logits[token] += value
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("penalty", [dict(presence=1.5), dict(frequency=0.7),
                                     dict(repetition=1.8), dict(presence=0.5, frequency=0.4,
                                                                repetition=1.3)],
                         ids=["presence", "frequency", "repetition", "all"])
def test_penalties_match_plain_pytorch(engine, penalty):
    _, path, llm = engine
    kw = dict(presence_penalty=penalty.get("presence", 0.0),
              frequency_penalty=penalty.get("frequency", 0.0),
              repetition_penalty=penalty.get("repetition", 1.0))
    prompts = _prompts(path)
    outs = _sample(llm, prompts, max_tokens=16, temperature=0.0, ignore_eos=True, **kw)
    plain = _sample(llm, prompts, max_tokens=16, temperature=0.0, ignore_eos=True)
    for prompt, out, base in zip(prompts, outs, plain):
        got = list(out.outputs[0].token_ids)
        assert got == _penalised_greedy(path, prompt, 16, **penalty)
    assert any(list(o.outputs[0].token_ids) != list(b.outputs[0].token_ids)
               for o, b in zip(outs, plain))  # the penalty changed something


def test_logit_bias_matches_plain_pytorch(engine):
    _, path, llm = engine
    prompts = _prompts(path)
    bias = {7: 1.5, 42: 2.5, 300: -50.0}
    outs = _sample(llm, prompts, max_tokens=12, temperature=0.0, ignore_eos=True,
                   logit_bias=bias)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == _penalised_greedy(path, prompt, 12, bias=bias)


def test_beam_search_matches_hf(engine):
    from vllm.sampling_params import BeamSearchParams

    _, path, llm = engine
    prompts = _prompts(path)
    width, n = 3, 8
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=width, max_tokens=n, ignore_eos=True))
    model = _hf(path)
    for prompt, out in zip(prompts, outs):
        with torch.inference_mode():
            ref = model.generate(torch.tensor([prompt]), num_beams=width,
                                 num_return_sequences=width, max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, length_penalty=1.0,
                                 early_stopping=False, pad_token_id=0)
        want = [seq[len(prompt):].tolist() for seq in ref]
        got = [list(s.tokens[len(prompt):]) for s in out.sequences]
        assert got == want, (got, want)


def test_stop_strings_cut_the_text_where_it_would_have_continued(engine):
    _, path, llm = engine
    prompt = _prompts(path)[1]
    (full,) = _sample(llm, [prompt], max_tokens=24, temperature=0.0, ignore_eos=True)
    text = full.outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop and text.index(stop) > 0
    (cut,) = _sample(llm, [prompt], max_tokens=24, temperature=0.0, ignore_eos=True,
                     stop=[stop])
    assert cut.outputs[0].text == text[:text.index(stop)]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == stop


def test_seeded_sampling_repeats_and_n_samples(engine):
    _, path, llm = engine
    prompts = _prompts(path)

    def run(seed, n=1):
        outs = _sample(llm, prompts, max_tokens=12, temperature=1.0, top_p=0.95, seed=seed,
                       ignore_eos=True, n=n)
        return [[list(c.token_ids) for c in o.outputs] for o in outs]

    first = run(11)
    assert run(11) == first  # the same seed, the same tokens
    assert run(12) != first
    many = run(11, n=4)
    assert all(len(o) == 4 for o in many) and run(11, n=4) == many
    assert all(len({tuple(c) for c in o}) > 1 for o in many)  # n samples, not n copies
    greedy = _sample(llm, prompts, max_tokens=12, temperature=0.0, ignore_eos=True)
    assert [[list(greedy[i].outputs[0].token_ids)] for i in range(2)] != first


def test_a_seeded_request_samples_the_same_when_its_prefill_is_chunked(engine):
    """Alone, the 33-token request prefills in one step; behind a 60-token prompt it gets
    a 4-token chunk first (the engine batches 64 tokens), whose sample is discarded and
    its generator rewound (CPU generators: by state, worker/seeded_sampling.py). Its
    tokens must not change."""
    _, path, llm = engine
    request = _prompts(path)[1]
    kw = dict(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    (alone,) = _sample(llm, [request], **kw)
    from vllm import SamplingParams

    long = random_prompt(999, 60, vocab(path))
    outs = llm.generate([{"prompt_token_ids": long}, {"prompt_token_ids": request}],
                        [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                         SamplingParams(**kw)], use_tqdm=False)
    assert list(outs[1].outputs[0].token_ids) == list(alone.outputs[0].token_ids)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 150},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"], "additionalProperties": False}


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_structured_output_choice_regex_and_json(engine, backend, float32_only):
    _, path, llm = engine
    own = None
    if backend != engine[0]:
        llm = own = _engine(path, float32_only, backend)
    try:
        _check_structured(llm, backend, _prompts(path))
    finally:
        if own is not None:
            shutdown(own)


def _check_structured(llm, backend: str, prompts) -> None:
    from vllm.sampling_params import StructuredOutputsParams

    def run(**constraint):
        outs = _sample(llm, prompts, max_tokens=96, temperature=0.0,
                       structured_outputs=StructuredOutputsParams(**constraint))
        assert all(o.outputs[0].finish_reason == "stop" for o in outs), \
            [(o.outputs[0].finish_reason, o.outputs[0].text) for o in outs]  # complete
        return [o.outputs[0].text for o in outs]

    choices = ["yes please", "no thanks", "maybe"]
    assert all(t in choices for t in run(choice=choices))
    pattern = r"[a-c]{2}-[0-9]{3}"
    assert all(re.fullmatch(pattern, t) for t in run(regex=pattern))
    for text in run(json=SCHEMA):
        value = json.loads(text)
        assert set(value) == {"name", "age", "ok"}, (backend, text)
        assert isinstance(value["name"], str) and len(value["name"]) <= 8
        assert isinstance(value["age"], int) and 0 <= value["age"] <= 150
        assert isinstance(value["ok"], bool)
