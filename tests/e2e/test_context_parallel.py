"""Decode context parallelism end to end: `--decode-context-parallel-size 2` on TP=2 (vLLM's
multiprocessing executor, collectives through the CPU HCCL simulator), greedy float32
tokens identical to HF transformers (which test_offline_parity shows equals TP=1).

The model has one KV head, so TP=2 replicates it and DCP=2 shards its cache by position.
"""
from __future__ import annotations

import pytest

from tests.e2e.engine import generate, make_llm, shutdown, vocab
from tests.e2e.reference import hf_greedy, random_prompt

BLOCK = 128


@pytest.fixture(scope="module")
def mqa_llama(tmp_path_factory):
    from vllm_npu.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("dcp") / "llama-mqa"), arch="llama",
                            num_key_value_heads=1)


def _count_dcp_work(worker) -> None:
    """Wrap, in this worker, the KV write (stored slots) and the LSE merge (calls)."""
    from vllm_npu import ops

    stats = {"stored": 0, "merges": 0}
    write, merge = ops._npu_reshape_and_cache, ops.npu_attention_update

    def counting_write(key, value, key_cache, value_cache, slots):
        stats["stored"] += int((slots >= 0).sum())
        return write(key, value, key_cache, value_cache, slots)

    def counting_merge(*args, **kwargs):
        stats["merges"] += 1
        return merge(*args, **kwargs)

    ops._npu_reshape_and_cache, ops.npu_attention_update = counting_write, counting_merge
    worker.dcp_stats = stats


def _dcp_stats(worker) -> dict:
    return worker.dcp_stats


@pytest.mark.parametrize("interleave", [1, BLOCK])
def test_dcp2_on_tp2_matches_hf(mqa_llama, parity_dtype, interleave):
    """Prompts across the 256-token virtual block (128 per rank), chunked 64 at a time
    (later chunks read their context from both ranks' shards), then decode."""
    v = vocab(mqa_llama)
    prompts = [random_prompt(70 + i, n, v) for i, n in enumerate((5, 130, 300))]
    llm = make_llm(mqa_llama, parity_dtype, tensor_parallel_size=2,
                   decode_context_parallel_size=2, cp_kv_cache_interleave_size=interleave,
                   distributed_executor_backend="mp", enable_sleep_mode=False)
    try:
        llm.collective_rpc(_count_dcp_work)
        got = generate(llm, prompts, 16)
        stats = llm.collective_rpc(_dcp_stats)
    finally:
        shutdown(llm)
    assert got == [hf_greedy(mqa_llama, p, 16) for p in prompts]
    # Each rank stored its share of every token once per layer (2 layers); the shares
    # add up to all tokens that entered the cache.
    total = 2 * sum(len(p) + 16 - 1 for p in prompts)
    assert sum(s["stored"] for s in stats) == total
    assert all(s["stored"] < 0.7 * total for s in stats)
    assert all(s["merges"] > 0 for s in stats)  # the sharded context was merged


@pytest.mark.parametrize("args,match", [
    (dict(tensor_parallel_size=2, decode_context_parallel_size=2,
          cp_kv_cache_interleave_size=48), "interleave-size 48 does not divide"),
    (dict(tensor_parallel_size=1, prefill_context_parallel_size=2),
     "prefill-context-parallel-size 2 is not supported"),
])
def test_unsupported_context_parallel_fails_at_startup(mqa_llama, args, match):
    with pytest.raises(ValueError, match=match):
        make_llm(mqa_llama, "float32", distributed_executor_backend="mp", **args)


def test_dcp_needs_more_tp_ranks_than_kv_heads(tiny_models):
    """vLLM's own check, which the platform leaves in place: 2 KV heads on TP=2 cannot
    shard by context (each rank's KV head is its own)."""
    with pytest.raises(ValueError, match="greater than the model's total number of KV"):
        make_llm(tiny_models["llama"], "float32", tensor_parallel_size=2,
                 decode_context_parallel_size=2, distributed_executor_backend="mp")
