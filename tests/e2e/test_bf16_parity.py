"""Parity in the device's dtype: engines in bfloat16 (default graph mode, so the bf16 dtype
and alignment rules of every simulated op and graph task are active) against HF
transformers in bfloat16.

Token-exact parity is a float32 property (the other e2e suites). In bf16, two correct
implementations round differently, so this suite measures agreement under teacher forcing.
HF scores the engine's greedy continuation, and each arch must meet both of these:
- top-1 agreement: the share of positions where HF's argmax is the engine's token;
- |logprob difference|: the gap between the engine's logprob of its token and HF's
  logprob of the same token, averaged over positions (and at its maximum, where bounded).

Thresholds were chosen on prompt seeds 1-6 and are checked here on seeds 11-16.
Seeds 1-6 measured, top-1 / mean / max |Δ logprob|:
- llama: 0.986 / 0.0078 / 0.031
- deepseek_v3 (MLA + MoE): 0.986 / 0.0078 / 0.031
- qwen3_moe: 0.958 / 0.024 / 0.91

qwen3_moe's maximum is unbounded by design: a bf16 rounding can flip one token's expert
choice, which moves its logits discontinuously.
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.engine import make_llm, shutdown, vocab
from tests.helpers.reference import random_prompt

SEEDS = range(11, 17)  # report seeds (thresholds were tuned on 1-6)
MAX_TOKENS = 24
# arch -> (min top-1 agreement, max mean |Δ logprob|, max |Δ logprob| or None)
THRESHOLDS = {
    "llama": (0.95, 0.02, 0.1),
    "deepseek_v3": (0.95, 0.02, 0.1),
    "qwen3_moe": (0.93, 0.05, None),
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("bf16")
    return functools.cache(lambda arch: build_tiny_model(str(root / arch), arch=arch))


def _engine_greedy(path: str, prompts: list[list[int]]):
    """The engine's greedy tokens with the logprob it gave each, and its graph replays."""
    from vllm import SamplingParams

    from vllm_npu.compilation.acl_graph import ACLGraphWrapper

    llm = make_llm(path, "bfloat16", enable_sleep_mode=False)
    replays0 = ACLGraphWrapper.stats.replays
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                            use_tqdm=False)
        replays = ACLGraphWrapper.stats.replays - replays0
    finally:
        shutdown(llm)
    results = []
    for o in outs:
        tokens = list(o.outputs[0].token_ids)
        logprobs = [step[t].logprob for step, t in zip(o.outputs[0].logprobs, tokens)]
        results.append((tokens, logprobs))
    return results, replays


@torch.inference_mode()
def _hf_scores(path: str, prompts, results):
    """HF bf16 under teacher forcing: (agreements, |Δ logprob| per position)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    agree, diffs = [], []
    for prompt, (tokens, logprobs) in zip(prompts, results):
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        hf_logprobs = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        for row, token, lp in zip(hf_logprobs, tokens, logprobs):
            agree.append(int(row.argmax()) == token)
            diffs.append(abs(float(row[token]) - lp))
    return agree, diffs


@pytest.mark.parametrize("arch", list(THRESHOLDS))
def test_bf16_engine_agrees_with_hf_bf16(build, arch):
    path = build(arch)
    v = vocab(path)
    prompts = [random_prompt(s, 5 + 37 * (s % 7), v) for s in SEEDS]
    results, replays = _engine_greedy(path, prompts)
    assert replays > 0  # decode steps replayed the default FULL_DECODE_ONLY graphs in bf16
    agree, diffs = _hf_scores(path, prompts, results)
    assert len(agree) == len(SEEDS) * MAX_TOKENS
    top1 = sum(agree) / len(agree)
    mean = sum(diffs) / len(diffs)
    min_top1, max_mean, max_any = THRESHOLDS[arch]
    figures = f"{arch}: top-1 {top1:.3f}, mean |Δlp| {mean:.4f}, max {max(diffs):.3f}"
    assert top1 >= min_top1, figures
    assert mean <= max_mean, figures
    if max_any is not None:
        assert max(diffs) <= max_any, figures
