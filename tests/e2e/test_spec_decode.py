"""Speculative decoding on the simulated NPU: n-gram, a draft model, EAGLE, EAGLE-3 and
DeepSeek MTP, through vLLM's proposers and rejection sampler.

Every method's greedy tokens equal HF transformers' (which equal speculation off, see
test_offline_parity), eagerly and (n-gram, draft model) under the default FULL_DECODE_ONLY
graphs; EAGLE, EAGLE-3 and MTP run under graphs in test_spec_acceptance.py. The draft
heads are random, so most drafts are rejected and the verification path decides every
token; the draft model that *is* the target is accepted throughout, which only happens
when the draft positions' metadata (sequence lengths, slots, block tables) is right.
"""
from __future__ import annotations

import pytest
import torch

from tests.helpers.engine import generate, make_llm, metric, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt
from vllm_npu.compilation.acl_graph import ACLGraphWrapper

CASES = {  # method -> (target, draft, draft tokens)
    "ngram": ("llama", None, 3),
    "draft_model": ("llama", "self", 3),
    "eagle": ("llama", "eagle", 3),
    "eagle3": ("llama", "eagle3", 2),
    "mtp": ("deepseek_mtp", None, 1),
}
# Uniform decode batches (every request carries the same number of drafts) replay FULL graphs.
UNIFORM = {"draft_model", "eagle", "eagle3", "mtp"}


@pytest.fixture(scope="module")
def spec_models(tiny_models, tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_drafts import add_mtp_layer, build_eagle_draft
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("spec")
    llama = tiny_models["llama"]
    return {"llama": llama, "self": llama,
            "eagle": build_eagle_draft(str(root / "eagle"), llama, "eagle"),
            "eagle3": build_eagle_draft(str(root / "eagle3"), llama, "eagle3"),
            "deepseek_mtp": add_mtp_layer(build_tiny_model(str(root / "dsv3-mtp"),
                                                           arch="deepseek_v3"))}


def _spec_config(method: str, models: dict[str, str]) -> dict:
    _, draft, k = CASES[method]
    config = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        config.update(prompt_lookup_min=2, prompt_lookup_max=4)
    if draft is not None:
        config["model"] = models[draft]
    return config


def _prompts(path: str) -> list[list[int]]:
    n = vocab(path)
    repetitive = [random_prompt(300 + i, 9, n) * 6 for i in range(3)]  # n-gram hits
    return repetitive + [random_prompt(310, 77, n), random_prompt(311, 1, n)]


# EAGLE, EAGLE-3 and MTP under graphs: test_spec_acceptance.py (three engines each, with
# drafts whose acceptance is known); here they run eagerly.
ENGINES = [(m, mode) for m in CASES for mode in ("graph", "eager")
           if mode == "eager" or m in ("ngram", "draft_model")]


@pytest.fixture(scope="module", params=ENGINES, ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, spec_models, parity_dtype):
    method, mode = request.param
    path = spec_models[CASES[method][0]]
    llm = make_llm(path, parity_dtype, enforce_eager=mode == "eager",
                   speculative_config=_spec_config(method, spec_models))
    yield method, mode, path, llm
    shutdown(llm)


def test_tokens_match_hf_and_drafts_are_verified(engine):
    method, mode, path, llm = engine
    config = llm.llm_engine.vllm_config
    # vLLM runs n-gram (a CPU proposer) synchronously; every other method overlaps steps.
    assert config.scheduler_config.async_scheduling == (method != "ngram")
    prompts = _prompts(path)
    drafts0 = metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = metric(llm, "vllm:spec_decode_num_accepted_tokens")
    replays0 = ACLGraphWrapper.stats.replays
    got = generate(llm, prompts, 24)
    assert got == [hf_greedy(path, p, 24) for p in prompts]
    drafts = metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0
    accepted = metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0
    assert drafts > 0
    if method == "ngram":
        assert accepted > 0  # the repeated prompts are looked up
    if method == "draft_model":  # the draft is the target: everything is accepted
        assert accepted / drafts >= 0.95
    replays = ACLGraphWrapper.stats.replays - replays0
    if mode == "graph" and method in UNIFORM:
        assert replays > 0, "uniform spec-decode batches should replay FULL graphs"
    if mode == "eager":
        assert replays == 0


def test_draft_positions_metadata_is_consistent(engine, mocker):
    """Every attention build (target verification and draft steps): each request's tokens
    sit at the last positions of its sequence, and their slots are those positions'
    slots in its block table (or the padding slot). One length short or one slot off is
    the classic cause of zero acceptance."""
    method, mode, path, llm = engine
    if method != "draft_model" or mode != "graph":
        pytest.skip("checked on the draft_model engine (two attention stacks, graphs)")
    from vllm_npu.attention.backend import NPUAttentionMetadataBuilder

    seen = []
    build = NPUAttentionMetadataBuilder.build

    def spy(self, *args, **kwargs):
        meta = build(self, *args, **kwargs)
        cm = kwargs.get("common_attn_metadata", args[1] if len(args) > 1 else None)
        seen.append((meta, cm.block_table_tensor.clone(), cm.slot_mapping.clone()))
        return meta

    mocker.patch.object(NPUAttentionMetadataBuilder, "build", spy)
    generate(llm, _prompts(path)[:3], 8)
    assert len(seen) > 10
    block = llm.llm_engine.vllm_config.cache_config.block_size
    checked = 0
    for meta, table, slots in seen:
        start = 0
        for i, (end, kv_len) in enumerate(zip(meta.query_ends, meta.seq_lens_list)):
            q = end - start
            if q == 0:  # vLLM's padding request of a graph-sized batch
                continue
            assert q <= kv_len
            for t, pos in zip(range(start, end), range(kv_len - q, kv_len)):
                want = int(table[i, pos // block]) * block + pos % block
                assert int(slots[t]) in (want, -1), (i, t, pos)
                checked += int(slots[t]) == want
            start = end
    assert checked > 0


def test_too_many_draft_tokens_or_an_unsupported_method_are_refused_at_start(tiny_models):
    from vllm import LLM

    path = tiny_models["llama"]
    with pytest.raises(ValueError, match=r"num_speculative_tokens 16 .*valid 1\.\.15"):
        LLM(path, dtype="float32", max_model_len=256,
            speculative_config={"method": "ngram", "num_speculative_tokens": 16,
                                "prompt_lookup_max": 3})
    with pytest.raises(ValueError, match=r"method 'ngram_gpu' is not supported.*'ngram'"):
        LLM(path, dtype="float32", max_model_len=256,
            speculative_config={"method": "ngram_gpu", "num_speculative_tokens": 3,
                                "prompt_lookup_max": 3})


def test_rejection_sampler_override_is_what_vllm_calls(engine):
    """The batched kernels replace vLLM's Triton ones in the running engine."""
    method, mode, path, llm = engine
    if method != "ngram" or mode != "eager":
        pytest.skip("one engine is enough")
    from vllm.v1.sample import rejection_sampler

    from vllm_npu.spec_decode.rejection_kernels import rejection_greedy_sample_kernel

    kernel = rejection_sampler.rejection_greedy_sample_kernel
    out = torch.full((1, 3), -1, dtype=torch.int32)
    kernel[(1,)](out, torch.tensor([2], dtype=torch.int32), torch.tensor([5, 6],
                 dtype=torch.int32), torch.tensor([5, 7]), torch.tensor([[9]]), None, 2,
                 None, None, SYNTHETIC_MODE=False)
    assert out.tolist() == [[5, 7, -1]]  # first draft accepted, second replaced, no bonus
    assert getattr(kernel, "func", None) is rejection_greedy_sample_kernel
