"""n-gram speculative decoding with tensor parallelism (TP=2, vLLM's multiprocessing
executor): greedy tokens equal HF transformers'. Its own module: no in-process engine may
be alive while the TP workers start."""
from __future__ import annotations

import pytest

from tests.helpers.engine import generate, make_llm, metric, shutdown
from tests.helpers.reference import hf_greedy
from tests.e2e.test_spec_decode import _prompts, _spec_config

pytestmark = pytest.mark.usefixtures("spawn_workers")


def test_ngram_with_tensor_parallel_matches_hf(tiny_models, parity_dtype):
    path = tiny_models["llama"]
    prompts = _prompts(path)[:3]
    llm = make_llm(path, parity_dtype, tensor_parallel_size=2,
                   distributed_executor_backend="mp", enable_sleep_mode=False,
                   speculative_config=_spec_config("ngram", {}))
    try:
        got = generate(llm, prompts, 16)
        accepted = metric(llm, "vllm:spec_decode_num_accepted_tokens")
    finally:
        shutdown(llm)
    assert got == [hf_greedy(path, p, 16) for p in prompts]
    assert accepted > 0


