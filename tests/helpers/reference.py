"""Independent reference: greedy decoding with HF transformers on the CPU, in float32 (the
simulated NPU: token-exact) or a device dtype (near ties allowed, see NearGreedy)."""
from __future__ import annotations

import functools
import os

import torch


# A device dtype's greedy tokens may leave the reference's where its top two are this close
# (logprob of its own token minus that of the engine's). Two correct implementations round
# differently there; measured (tests/e2e/test_device_dtype_parity.py, teacher-forced): max
# |Δ logprob| 0.03-0.045 for bf16 dense and MLA models, 0.014 for fp16, up to 3.3 where a
# bf16 rounding flips a token's MoE expert choice (models that route get MOE_NEAR_TIE:
# the same test's qwen3_moe bf16 mean |Δ logprob| is 0.025-0.06).
NEAR_TIE = {"bfloat16": 0.1, "float16": 0.05}
MOE_NEAR_TIE = 1.0


def parity_dtype() -> str:
    """The dtype engines are checked against HF in: float32 on the simulated NPU (token-
    exact), the device's bfloat16 on a device; VLLM_NPU_TEST_DTYPE picks another (e.g.
    bfloat16 on the simulator, to run the device's way here)."""
    from vllm_npu.device import select_backend

    default = "float32" if select_backend().simulated else "bfloat16"
    dtype = os.environ.get("VLLM_NPU_TEST_DTYPE") or default
    if dtype != "float32" and dtype not in NEAR_TIE:
        raise ValueError(f"VLLM_NPU_TEST_DTYPE={dtype!r}; valid: float32, {sorted(NEAR_TIE)}")
    return dtype


@functools.cache
def _model(path: str, overrides: tuple = (), dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
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


class NearGreedy(list):
    """HF's greedy tokens in a device dtype (bfloat16 / float16). Equal to an engine's
    tokens when every token matches, or when the first that differs is a near tie: the
    reference's logprob of its own token leads its logprob of the engine's by at most
    `tie`. After that the two continue from different prefixes and are not compared."""
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, tokens: list[int], model, prompt: list[int], tie: float):
        super().__init__(tokens)
        self.model, self.prompt, self.tie = model, list(prompt), tie

    @torch.inference_mode()
    def __eq__(self, other):
        if not isinstance(other, list):
            return NotImplemented
        mine, theirs = list(self), list(other)
        if mine == theirs:
            return True
        if len(mine) != len(theirs):
            return False
        j = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        logits = self.model(torch.tensor([self.prompt + mine[:j]])).logits[0, -1].float()
        lp = torch.log_softmax(logits, dim=-1)
        return float(lp[mine[j]] - lp[theirs[j]]) <= self.tie

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal


def hf_greedy(path: str, prompt_ids: list[int], max_tokens: int,
              **config_overrides) -> list[int]:
    """`max_tokens` greedy tokens after `prompt_ids` (EOS ignored, as with ignore_eos), in
    the parity dtype: a plain list in float32 (token-exact), else a NearGreedy."""
    dtype = parity_dtype()
    model = _model(path, tuple(sorted(config_overrides.items())), dtype)
    tokens = greedy(model, prompt_ids, max_tokens)
    if dtype == "float32":
        return tokens
    return NearGreedy(tokens, model, prompt_ids,
                      MOE_NEAR_TIE if _routes_experts(model.config) else NEAR_TIE[dtype])


def _routes_experts(config) -> bool:
    c = config.to_dict()
    if c.get("num_experts") or c.get("num_local_experts"):
        return True
    return bool(c.get("n_routed_experts")) and \
        c.get("first_k_dense_replace", 0) < c.get("num_hidden_layers", 0)


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
