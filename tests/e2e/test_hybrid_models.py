"""Models whose KV pool holds more than attention's K/V keep it right through what the
engine does to requests: the hybrids' per-request state (Mamba-2 / Gated DeltaNet layers
beside attention) and DeepSeek-V3.2's indexer key cache (its own KV cache group beside
the latent cache; the indexer picks 16 keys per token, so every prompt here attends
sparsely). Prompts longer than one prefill chunk, prefix-cache hits (for the hybrids,
vLLM's 'align' mode restores the state saved at a block boundary), preemption under a
small KV pool, and aborts. Every answer is HF's greedy tokens for the same prompt;
engines run vLLM's default graph mode and block size."""
from __future__ import annotations

import functools

import pytest

from tests.helpers.engine import generate, metric, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt

MODELS = ("granite_hybrid", "qwen3_next", "deepseek_v32")
MAX_TOKENS = 8
LONG = 40  # tokens past the prompt in the preemption test
BLOCK = 128  # the hybrids' aligned attention blocks and MLA's: 128 tokens


@pytest.fixture(scope="module")
def hybrid_root(tmp_path_factory):
    return tmp_path_factory.mktemp("hybrid")


@functools.cache
def _build(root: str, name: str) -> str:
    from vllm_npu.testing import tiny_archs

    return tiny_archs.build_tiny_arch(f"{root}/tiny-{name}", name)


def _prompts(path: str) -> list[list[int]]:
    """Two prompts sharing 2 blocks of prefix (a cache hit for the second), one that
    shares nothing; all longer than the 64-token prefill chunks used below."""
    v = vocab(path)
    shared = random_prompt(1, 2 * BLOCK + 9, v)
    return [shared + random_prompt(2, 17, v), shared + random_prompt(3, 40, v),
            random_prompt(4, 150, v)]


def _llm(path: str, **overrides):
    from vllm import LLM

    kwargs = dict(dtype="float32", max_model_len=1024, seed=0, max_num_batched_tokens=64,
                  enable_prefix_caching=True, disable_log_stats=False,
                  num_gpu_blocks_override=256)
    kwargs.update(overrides)
    return LLM(path, **kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_and_prefix_hits_carry_the_state(hybrid_root, name):
    path = _build(str(hybrid_root), name)
    prompts = _prompts(path)
    want = [hf_greedy(path, p, MAX_TOKENS, attn_implementation="eager") for p in prompts]
    llm = _llm(path)
    try:
        first = generate(llm, prompts[:1], MAX_TOKENS)
        hits_before = metric(llm, "vllm:prefix_cache_hits")
        rest = generate(llm, prompts[1:], MAX_TOKENS)
        hits = metric(llm, "vllm:prefix_cache_hits") - hits_before
    finally:
        shutdown(llm)
    assert first + rest == want
    assert hits >= 2 * BLOCK, f"the shared prefix was not served from the cache ({hits})"


@pytest.mark.parametrize("name", MODELS)
def test_preemption_and_aborts_leave_the_state_consistent(hybrid_root, name):
    """A pool too small for all requests at once preempts some (their state is recomputed
    on resumption); aborted requests free theirs. The survivors still give HF's tokens
    and the pool is empty afterwards."""
    from vllm import SamplingParams

    path = _build(str(hybrid_root), name)
    v = vocab(path)
    # each request grows past a block boundary while the others hold theirs
    prompts = [random_prompt(20 + i, 100 + 5 * i, v) for i in range(6)]
    want = [hf_greedy(path, p, LONG, attn_implementation="eager") for p in prompts]
    # FULL decode graphs need a state block per sequence they may hold: max_num_seqs <= pool
    llm = _llm(path, num_gpu_blocks_override=8, max_num_seqs=8, enable_prefix_caching=False,
               max_model_len=512)
    engine = llm.llm_engine
    try:
        params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        for i in range(2):
            engine.add_request(f"doomed-{i}", {"prompt_token_ids": prompts[i]}, params)
        engine.step()
        engine.abort_request([f"doomed-{i}" for i in range(2)])
        got = generate(llm, prompts, LONG)
        preempted = metric(llm, "vllm:num_preemptions")
        usage = metric(llm, "vllm:kv_cache_usage_perc")
    finally:
        shutdown(llm)
    assert got == want
    assert preempted > 0, "the pool was large enough for every request: nothing preempted"
    assert usage == 0.0


def test_sparse_attention_refuses_speculative_decoding_at_startup(hybrid_root):
    """MTP shares the indexer's picks across draft steps, which the NPU path does not do:
    the engine stops while building the model, naming the setting."""
    path = _build(str(hybrid_root), "deepseek_v32")
    from vllm.distributed import cleanup_dist_env_and_memory

    try:
        with pytest.raises(NotImplementedError, match="without --speculative-config"):
            _llm(path, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                           "prompt_lookup_max": 3})
    finally:
        cleanup_dist_env_and_memory()  # the in-process engine stopped half-built
