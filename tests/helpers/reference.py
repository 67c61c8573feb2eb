"""Independent reference: greedy decoding with HF transformers, float32, on the CPU."""
from __future__ import annotations

import functools

import torch


@functools.cache
def _model(path: str, overrides: tuple = ()):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                **dict(overrides)).eval()


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """`max_tokens` greedy tokens of an HF-style causal LM (EOS ignored), with its cache."""
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    generated: list[int] = []
    for _ in range(max_tokens):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values,
                    use_cache=True)
    return generated


def hf_greedy(path: str, prompt_ids: list[int], max_tokens: int,
              **config_overrides) -> list[int]:
    """`max_tokens` greedy tokens after `prompt_ids` (EOS ignored, as with ignore_eos)."""
    return greedy(_model(path, tuple(sorted(config_overrides.items()))), prompt_ids,
                  max_tokens)


def tokenize(path: str, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)(text).input_ids


def random_prompt(seed: int, length: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (length,), generator=g).tolist()


@torch.inference_mode()
def teacher_forced_scores(model, prompts: list[list[int]],
                          results: list[tuple[list[int], list[float]]]):
    """`model` (an HF causal LM) fed each prompt plus the engine's greedy tokens: per
    position, whether its argmax is the engine's token, and |its logprob of that token -
    the engine's logprob|. Returns (agreements, differences)."""
    agree, diffs = [], []
    for prompt, (tokens, logprobs) in zip(prompts, results):
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        ref = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        for row, token, lp in zip(ref, tokens, logprobs):
            agree.append(int(row.argmax()) == token)
            diffs.append(abs(float(row[token]) - lp))
    return agree, diffs
