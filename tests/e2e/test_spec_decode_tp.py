"""n-gram speculative decoding with tensor parallelism (TP=2, vLLM's multiprocessing
executor, in the engine host): greedy tokens equal HF transformers'."""
from __future__ import annotations

from tests.helpers.engine import generate, make_llm, metric, shutdown
from tests.helpers.reference import hf_greedy
from tests.e2e.test_spec_decode import _prompts, _spec_config


def _ngram_tp2(path: str, dtype: str, prompts):
    """In the engine host: greedy tokens and the accepted draft tokens."""
    llm = make_llm(path, dtype, tensor_parallel_size=2, distributed_executor_backend="mp",
                   enable_sleep_mode=False, speculative_config=_spec_config("ngram", {}))
    try:
        return generate(llm, prompts, 16), metric(llm, "vllm:spec_decode_num_accepted_tokens")
    finally:
        shutdown(llm)


def test_ngram_with_tensor_parallel_matches_hf(tiny_models, parity_dtype, engine_host):
    path = tiny_models["llama"]
    prompts = _prompts(path)[:3]
    got, accepted = engine_host.run(_ngram_tp2, path, parity_dtype, prompts)
    assert got == [hf_greedy(path, p, 16) for p in prompts]
    assert accepted > 0
