"""Random sampling on the simulated NPU checked against the distribution it should draw
from, not only for repeatability (test_sampling_features): HF transformers' float32 logits
of the same tiny llama, with vLLM's sampling definitions applied in plain PyTorch here.

vLLM's definitions (vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py): logits /
temperature first; then top-k (keep logits >= the k-th largest); then top-p on the
top-k-renormalised distribution, keeping in descending order every token whose preceding
mass is < p (the token that crosses p is kept); then a draw from the renormalised rest.
The speculative rejection sampler (rejection_sampler.py; its kernels are
vllm_npu/spec_decode/rejection_kernels.py) verifies drafts against that same distribution.

One engine serves every check: the tiny llama drafting for itself (draft_model, greedy
drafts). Requests of one token carry no drafts, so their token is the ordinary sampler's.
min-p is not checked: vLLM drops the min-p processor when speculative decoding is on, and
a second engine only for it would cost more than it guards.

What each check guards:
  temperature 0.7 / 1.3  chi-square of the next token's counts vs softmax(z / T), and a
      z-test of the mean raw logit z of the drawn tokens (the sufficient statistic for T;
      temperature applied twice or not at all moves it by 6-23 standard errors here).
  top-k 20, top-p, top-k 40 with top-p  no token outside the kept set appears; every kept
      token appears (a correct sampler misses one with probability < 1e-9 here, and the
      test asserts its sample size keeps that < 1e-6); chi-square vs the renormalised
      kept set. Each p lies halfway between two neighbouring cumulative masses of the
      reference, so the kept set is exact despite float noise, and a set one token larger
      or smaller fails; p is computed on the tempered (top-p, T = 0.6) or the top-k-
      renormalised (top-k with top-p) distribution, where the other order of operations
      keeps a larger set.
  speculative decoding at temperature 0.3  drafts are the target's untempered argmax,
      accepted with probability p_T(draft), else replaced by a draw from p_T without the
      draft. The first token comes from the ordinary sampler, the second and third from
      the rejection sampler (verification positions 0 and 1: the third comes from position
      1 when the first draft was accepted, else from the next verification). Chi-square
      of t2 given t1, pooled over the t1 values drawn >= 100 times, against HF's
      p_T(t2 | prompt, t1), and likewise of t3 given (t1, t2) over pairs drawn >= 50
      times; drafts must have been proposed for every request and some (not all)
      accepted. A sampler that accepts every draft or none, lets the replacement repeat
      the draft, verifies against the untempered target, or verifies position 1 against
      position 0's distribution fails.

Chi-square bins whose expected count is < 5 are pooled (with the smallest other bins while
the pool is still < 5). Every statistical check has false-alarm rate alpha = 1e-4 (through
the chi-square and normal approximations); there are 9 (2 per temperature, 1 per filter, 2
for speculative decoding), so a correct build fails this module with probability < 1e-3.
Every request has its own seed (`n` samples of one request get seeds seed..seed+n-1), so a
run is reproducible. The seeds (SEED below) were fixed before the first run and never
changed to make a test pass: they are one draw of the sampler's randomness, and the
p-values are real ones.
"""
from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from scipy import stats

from tests.helpers.engine import make_llm, metric, shutdown, vocab
from tests.helpers.reference import _model, random_prompt

ALPHA = 1e-4
SEED = 10_000  # config i draws with seeds SEED * (i + 1) + j, j < n: never shared
SPEC_T, SPEC_N, SPEC_K = 0.3, 2000, 2


def _prompt(path: str) -> list[int]:
    return random_prompt(900, 8, vocab(path))


@functools.cache
@torch.inference_mode()
def _logits(path: str, ids: tuple[int, ...]) -> torch.Tensor:
    """HF's raw next-token logits after `ids`, float64 [V]."""
    return _model(path, ())(torch.tensor([list(ids)])).logits[0, -1].double()


def _top_p_between(probs: torch.Tensor, keep: int) -> float:
    """A top-p that keeps exactly the `keep` most probable tokens of `probs` (vLLM keeps
    the token that crosses p): halfway between the mass of the top keep-1 and top keep."""
    mass = probs.sort(descending=True).values.cumsum(0)
    return float(mass[keep - 2] + mass[keep - 1]) / 2


def _reference(z: torch.Tensor, temperature: float, top_k: int | None = None,
               top_p: float | None = None) -> torch.Tensor:
    """vLLM's sampling distribution for raw logits `z`, in plain PyTorch (float64)."""
    probs = torch.softmax(z / temperature, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k is not None:
        keep &= z >= z.topk(top_k).values[-1]
    if top_p is not None:
        renorm = torch.where(keep, probs, 0.0)
        renorm = renorm / renorm.sum()
        values, order = renorm.sort(descending=True)
        before = values.cumsum(0) - values  # mass of the more probable tokens
        kept = torch.zeros_like(keep)
        kept[order[before < top_p]] = True
        keep &= kept
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


def _chi_square(counts: Counter, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom of `counts` vs `probs`: one bin per
    token expected >= 5 times, one for the rest (topped up from the smallest bins to 5)."""
    n = sum(counts.values())
    observed = torch.zeros_like(probs)
    for token, c in counts.items():
        observed[token] = c
    expected = probs * n
    order = expected.argsort(descending=True).tolist()
    bins = [[t] for t in order if expected[t] >= 5]
    rest = [t for t in order if expected[t] < 5]
    while rest and float(expected[rest].sum()) < 5 and len(bins) > 1:
        rest += bins.pop()
    cells = [(float(observed[b].sum()), float(expected[b].sum())) for b in bins + [rest]]
    cells = [(o, e) for o, e in cells if e > 0 or o > 0]
    stat = sum((o - e) ** 2 / e if e > 0 else float("inf") for o, e in cells)
    return stat, len(cells) - 1


def _p_value(stat: float, df: int) -> float:
    return float(stats.chi2.sf(stat, df)) if df > 0 else 1.0


@pytest.fixture(scope="module")
def engine(tiny_models, float32_only):
    """The tiny llama drafting for itself (greedily, SPEC_K tokens): requests of one token
    never carry drafts, so their token comes from the ordinary sampler."""
    path = tiny_models["llama"]
    # Thousands of requests of one 8-token prompt: wide batches, no graphs (sampling runs
    # outside them), enough blocks for a full batch (the prompt is shorter than a block).
    llm = make_llm(path, float32_only, enforce_eager=True, max_num_seqs=256,
                   max_num_batched_tokens=4096, num_gpu_blocks_override=1024,
                   speculative_config={"method": "draft_model", "model": path,
                                       "num_speculative_tokens": SPEC_K})
    yield path, llm
    shutdown(llm)


# ---------------------------------------------------------------- ordinary sampler


def _configs(path: str) -> dict[str, dict]:
    """Name -> SamplingParams kwargs (sample count n included), from HF's logits."""
    z = _logits(path, tuple(_prompt(path)))
    ranked = z.sort(descending=True).values
    for k in (20, 40):  # HF's and the engine's float32 logits agree to ~1e-5
        assert ranked[k - 1] - ranked[k] > 1e-3, f"top-k {k} boundary is nearly a tie"
    top40 = torch.where(z >= ranked[39], torch.softmax(z, -1), 0.0)
    return {
        "temperature_0.7": dict(n=2000, temperature=0.7),
        "temperature_1.3": dict(n=2000, temperature=1.3),
        "top_k": dict(n=1500, temperature=0.8, top_k=20),
        # p on the tempered distribution: keeps 25 tokens at T = 0.6, ~60 at T = 1
        "top_p": dict(n=1500, temperature=0.6,
                      top_p=_top_p_between(torch.softmax(z / 0.6, -1), 25)),
        # p on the top-40-renormalised distribution: keeps 15 (on the full one, 40)
        "top_k_top_p": dict(n=1500, temperature=1.0, top_k=40,
                            top_p=_top_p_between(top40 / top40.sum(), 15)),
    }


@pytest.fixture(scope="module")
def samples(engine):
    """One generate call: each config's n first tokens."""
    from vllm import SamplingParams

    path, llm = engine
    configs = _configs(path)
    params = [SamplingParams(max_tokens=1, ignore_eos=True, seed=SEED * (i + 1), **kw)
              for i, kw in enumerate(configs.values())]
    prompt = {"prompt_token_ids": _prompt(path)}
    outs = llm.generate([prompt] * len(params), params, use_tqdm=False)
    return path, configs, {name: [c.token_ids[0] for c in out.outputs]
                           for name, out in zip(configs, outs)}


@pytest.mark.parametrize("name", ["temperature_0.7", "temperature_1.3"])
def test_temperature_matches_softmax_of_scaled_logits(samples, name):
    path, configs, drawn = samples
    config = configs[name]
    z = _logits(path, tuple(_prompt(path)))
    probs = _reference(z, config["temperature"])
    tokens = drawn[name]
    assert len(tokens) == config["n"]
    p_chi = _p_value(*_chi_square(Counter(tokens), probs))
    mean = float((probs * z).sum())
    sd = float(((probs * z * z).sum() - mean ** 2) ** 0.5) / len(tokens) ** 0.5
    score = (float(z[tokens].mean()) - mean) / sd
    p_mean = float(2 * stats.norm.sf(abs(score)))
    print(f"{name}: chi-square p={p_chi:.3g}, mean-logit z={score:+.2f} p={p_mean:.3g}")
    assert p_chi > ALPHA, (name, p_chi)
    assert p_mean > ALPHA, (name, score, p_mean)


@pytest.mark.parametrize("name", ["top_k", "top_p", "top_k_top_p"])
def test_filters_keep_exactly_vllms_set_with_its_distribution(samples, name):
    path, configs, drawn = samples
    kw = {k: v for k, v in configs[name].items() if k != "n"}
    probs = _reference(_logits(path, tuple(_prompt(path))), **kw)
    tokens = drawn[name]
    kept = {int(t) for t in probs.nonzero()}
    outside = sorted(set(tokens) - kept)
    assert not outside, f"{name}: tokens outside the kept set were sampled: {outside}"
    # Every kept token shows up: a correct sampler misses one with probability below
    # sum (1 - p)^n over the kept set (checked to be negligible; catches a set one short).
    miss = sum((1 - float(probs[t])) ** len(tokens) for t in kept)
    assert miss < 1e-6, f"{name}: too few samples to see every kept token ({miss:.2g})"
    assert set(tokens) == kept, f"{name}: kept tokens never sampled: {sorted(kept - set(tokens))}"
    p = _p_value(*_chi_square(Counter(tokens), probs))
    print(f"{name}: {len(kept)} tokens kept, all seen (miss bound {miss:.1g}), "
          f"chi-square p={p:.3g}")
    assert p > ALPHA, (name, p)


# ------------------------------------------------------------ speculative decoding


@pytest.fixture(scope="module")
def spec_samples(engine):
    """SPEC_N seeded samples of 3 tokens at temperature SPEC_T, with the draft and
    accepted token counts they took."""
    from vllm import SamplingParams

    path, llm = engine
    drafts0 = metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = metric(llm, "vllm:spec_decode_num_accepted_tokens")
    params = SamplingParams(n=SPEC_N, seed=SEED * 100, temperature=SPEC_T, max_tokens=3,
                            ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": _prompt(path)}], params, use_tqdm=False)[0]
    drafts = metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0
    accepted = metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0
    return path, [list(c.token_ids) for c in out.outputs], drafts, accepted


def _conditional_chi_square(path: str, seqs: list[list[int]], position: int,
                            min_count: int) -> tuple[float, int, int]:
    """Token `position` given the ones before it, over the contexts drawn >= min_count
    times: summed statistic, degrees of freedom, and the number of samples used."""
    prompt = _prompt(path)
    contexts = Counter(tuple(s[:position]) for s in seqs)
    total, df, used = 0.0, 0, 0
    for context, count in contexts.items():
        if count < min_count:
            continue
        probs = _reference(_logits(path, tuple(prompt) + context), SPEC_T)
        stat, d = _chi_square(Counter(s[position] for s in seqs
                                      if tuple(s[:position]) == context), probs)
        total, df, used = total + stat, df + d, used + count
    return total, df, used


def test_spec_decode_drafts_are_proposed_accepted_and_rejected(spec_samples):
    _, seqs, drafts, accepted = spec_samples
    assert all(len(s) == 3 for s in seqs)
    print(f"drafts {drafts:.0f}, accepted {accepted:.0f}")
    # every request verifies SPEC_K drafts for its second token at least
    assert drafts >= SPEC_K * SPEC_N
    # p_T(argmax) is ~0.2-0.6 here: a sampler accepting all or none of them is broken
    assert 0.1 * drafts < accepted < 0.9 * drafts


@pytest.mark.parametrize("position,min_count,min_used", [(1, 100, 1000), (2, 50, 250)],
                         ids=["second_token", "third_token"])
def test_spec_decode_tokens_follow_the_targets_distribution(spec_samples, position,
                                                            min_count, min_used):
    path, seqs, _, _ = spec_samples
    stat, df, used = _conditional_chi_square(path, seqs, position, min_count)
    p = _p_value(stat, df)
    print(f"token {position + 1}: {used} samples, df {df}, chi-square p={p:.3g}")
    assert used >= min_used  # enough of the draws are checked
    assert p > ALPHA, (position, stat, df, p)
