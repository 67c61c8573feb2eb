"""Context parallelism end to end (vLLM's multiprocessing executor, collectives through the
CPU HCCL simulator): greedy float32 tokens identical to HF transformers (which
test_offline_parity shows equals one device).

Decode CP (`--decode-context-parallel-size 2` on TP=2 and TP=4):
standard attention on a model with one KV head, which TP=2 replicates and DCP=2 shards by
position. MLA (DeepSeek-V3 style, small and real attention dims): the one latent "head" is
sharded the same way; vLLM's MLA layer gathers query heads and merges the ranks' decode
outputs, the backend gathers context latents for prefill.

Prefill CP (`--prefill-context-parallel-size 2` on TP=1 and TP=2, paged backend): each
PCP rank runs the model on its slice of every batch's tokens; the KV cache is replicated.
"""
from __future__ import annotations

import pytest

from tests.helpers.engine import generate, make_llm, metric, shutdown, vocab
from tests.helpers.engine_host import generate_with_make_llm
from tests.helpers.reference import hf_greedy, random_prompt

# Workers spawn: the in-process MoE engines of earlier modules (test_device_dtype_parity) leave a
# gloo group that a forked worker would finalise and hang on (see tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("spawn_workers")

BLOCK = 128


MODELS = {  # name -> build_tiny_model arguments
    "llama-mqa": dict(arch="llama", num_key_value_heads=1),
    "mla-small": dict(arch="deepseek_v3", qk_nope_head_dim=32, v_head_dim=32),
    "mla-dsv3": dict(arch="deepseek_v3", kv_lora_rank=512, qk_rope_head_dim=64,
                     qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=96),
    "mistral-mqa": dict(arch="mistral", num_key_value_heads=1, sliding_window=48),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("dcp")
    return lambda name: build_tiny_model(str(root / name), **MODELS[name])


def _count_work(worker) -> None:
    """Wrap, in this worker, the op-surface calls the assertions count: rows stored in the
    KV cache, shard-level attention returning an lse (standard: the merge op; MLA: the
    latent decode op), and query rows of the paged backend's attention."""
    from vllm_npu import ops
    from vllm_npu.ops.sim import update_stream

    stats = {"stored": 0, "lse_calls": 0, "query_rows": 0}
    _fresh_slots(worker)  # every replay's cache write then passes through the op (counted)

    def wrap(name: str, count) -> None:
        original = getattr(ops, name)

        def call(*args, **kwargs):
            with update_stream.exempt():  # the test's count, not work the plugin issues
                key, n = count(*args, **kwargs)
            stats[key] += n
            return original(*args, **kwargs)
        setattr(ops, name, call)

    def stored(*args, **kwargs):
        return "stored", int((args[-1] >= 0).sum())  # slots come last

    wrap("_npu_reshape_and_cache", stored)
    wrap("npu_attention_update", lambda *args, **kwargs: ("lse_calls", 1))
    wrap("npu_multi_head_latent_attention",  # MLA decode: with DCP it returns an lse
         lambda *args, **kwargs: ("lse_calls", int(bool(kwargs.get("return_lse")))))
    wrap("npu_fused_infer_attention_score_out",
         lambda q, *args, **kwargs: ("query_rows", q.shape[0]))
    worker.work = stats
    worker.graph_base = _graph_counts()  # a forked worker inherits the parent's counters


def _graph_counts() -> tuple[int, int]:
    from vllm_npu.compilation.acl_graph import ACLGraphWrapper
    from vllm_npu.compilation.graph_params import GRAPH_PARAMS

    return ACLGraphWrapper.stats.replays, GRAPH_PARAMS.updates


def _stats(worker) -> dict:
    (replays, updates) = _graph_counts()
    replays0, updates0 = getattr(worker, "graph_base", (0, 0))
    return getattr(worker, "work", {}) | {
        "replays": replays - replays0, "updates": updates - updates0,
        "cudagraph_mode": worker.model_runner.compilation_config.cudagraph_mode.name}


def _workload_engine(path: str, dtype: str, prompts, shared, **engine_args):
    """In the engine host: tokens for `prompts` (16 each), then `shared` (8), the prefix
    cache hits of the second step and each worker's stats."""
    llm = make_llm(path, dtype, distributed_executor_backend="mp", enable_sleep_mode=False,
                   **engine_args)
    try:
        llm.collective_rpc(_count_work)
        got = generate(llm, prompts, 16)
        hits_before = metric(llm, "vllm:prefix_cache_hits")
        got_shared = generate(llm, [shared], 8)
        hits = metric(llm, "vllm:prefix_cache_hits") - hits_before
        return got, got_shared, hits, llm.collective_rpc(_stats)
    finally:
        shutdown(llm)


def _run_workload(host, path: str, dtype: str, seed: int, **engine_args):
    """Prompts of 5, 130 and 300 tokens x 16 (chunked 64 at a time, across the 256-token
    virtual block), then a prompt sharing 260 tokens of the last one x 8; asserts tokens
    equal HF and a 256-token prefix-cache hit. Returns (positions computed per request,
    each worker's stats)."""
    v = vocab(path)
    prompts = [random_prompt(seed + i, n, v) for i, n in enumerate((5, 130, 300))]
    shared = prompts[2][:260] + random_prompt(seed + 9, 20, v)
    got, got_shared, hits, stats = host.run(_workload_engine, path, dtype, prompts, shared,
                                            **engine_args)
    assert got == [hf_greedy(path, p, 16) for p in prompts]
    assert got_shared == [hf_greedy(path, shared, 8)]
    assert hits == 2 * BLOCK  # one 256-token block of the scheduler
    computed = [range(len(p) + 16 - 1) for p in prompts]
    return computed + [range(hits, len(shared) + 8 - 1)], stats


@pytest.mark.parametrize("model,interleave", [
    ("llama-mqa", 1), ("llama-mqa", BLOCK), ("mla-small", 1), ("mla-dsv3", BLOCK)])
def test_dcp2_on_tp2_matches_hf(models, parity_dtype, engine_host, model, interleave):
    """Later chunks read their context from both ranks' shards; the prefix-cache hit is a
    256-token virtual block, 128 tokens on each rank."""
    computed, stats = _run_workload(engine_host, models(model), parity_dtype, 70,
                                    tensor_parallel_size=2, decode_context_parallel_size=2,
                                    cp_kv_cache_interleave_size=interleave)
    # Each rank stored exactly the computed positions p with (p // I) % 2 == rank, once
    # per layer (2 layers): the cache is sharded, nothing is stored twice.
    for rank, s in enumerate(stats):
        assert s["stored"] == 2 * sum((p // interleave) % 2 == rank
                                      for r in computed for p in r)
    assert all(s["lse_calls"] > 0 for s in stats)  # the sharded context was merged
    # Decode steps replayed FULL graphs with refreshed tasks (standard backend); MLA runs
    # DCP eagerly.
    graphs = model.startswith("llama")
    assert all((s["replays"] > 0 and s["updates"] > 0) == graphs for s in stats)


@pytest.mark.parametrize("model,args,match", [
    ("llama-mqa", dict(decode_context_parallel_size=2, cp_kv_cache_interleave_size=48),
     "interleave-size 48 does not divide"),
    ("llama-mqa", dict(prefill_context_parallel_size=2, decode_context_parallel_size=2),
     "together with \\['decode context parallelism'\\]"),
    ("llama-mqa", dict(prefill_context_parallel_size=2, pipeline_parallel_size=2,
                       tensor_parallel_size=1), "together with \\['pipeline parallelism'\\]"),
    ("mistral-mqa", dict(decode_context_parallel_size=2),
     "sliding-window attention \\(window 48\\) is not supported"),
])
def test_unsupported_context_parallel_fails_at_startup(models, model, args, match):
    """Refused while the configuration is built: no worker is started."""
    with pytest.raises(ValueError, match=match):
        make_llm(models(model), "float32", distributed_executor_backend="mp",
                 **({"tensor_parallel_size": 2} | args))


def test_dcp_needs_more_tp_ranks_than_kv_heads(tiny_models):
    """vLLM's own check, which the platform leaves in place: 2 KV heads on TP=2 cannot
    shard by context (each rank's KV head is its own)."""
    with pytest.raises(ValueError, match="greater than the model's total number of KV"):
        make_llm(tiny_models["llama"], "float32", tensor_parallel_size=2,
                 decode_context_parallel_size=2, distributed_executor_backend="mp")


def test_dcp2_on_tp4_matches_hf(tiny_models, parity_dtype, engine_host):
    """DCP narrower than TP: ranks {0,1} and {2,3} form two DCP groups, each replicating
    one of the model's two KV heads and sharding its cache by position."""
    path = tiny_models["llama"]  # 4 query heads / 2 KV heads: one query head per rank
    prompts = [random_prompt(80 + i, n, vocab(path)) for i, n in enumerate((40, 270))]
    got = engine_host.run(generate_with_make_llm, path, parity_dtype, prompts, 12,
                          tensor_parallel_size=4, decode_context_parallel_size=2,
                          distributed_executor_backend="mp", enable_sleep_mode=False)
    assert got == [hf_greedy(path, p, 12) for p in prompts]


def _fresh_slots(worker) -> None:
    """int32 slots made fresh each step (the builder normally writes them into one mirror
    buffer, where a captured cache-write task keeps finding them): every FULL replay then
    re-issues its cache write, through the op surface."""
    import torch

    from vllm_npu.attention.backend import NPUAttentionMetadataBuilder

    NPUAttentionMetadataBuilder._int32_slots = lambda self, slots: slots.to(torch.int32)
    for groups in worker.model_runner.attn_groups:  # graphs captured at startup read these
        for group in groups:
            for builder in group.metadata_builders:
                builder._slots_mirror = None


def _skip_graph_updates(worker) -> None:
    from vllm_npu.attention.backend import NPUAttentionImpl

    NPUAttentionImpl.update_graph_params = lambda *args, **kwargs: None
    _fresh_slots(worker)


def _replay_without_the_update_hook(path: str, dtype: str, prompts) -> str | None:
    """In the engine host: the error generate raised (None if it did not)."""
    llm = make_llm(path, dtype, tensor_parallel_size=2, decode_context_parallel_size=2,
                   distributed_executor_backend="mp", enable_sleep_mode=False,
                   async_scheduling=False)
    try:
        llm.collective_rpc(_skip_graph_updates)
        generate(llm, prompts, 12)
    except RuntimeError as e:
        return str(e)
    finally:
        shutdown(llm)
    return None


def test_dcp_decode_graphs_need_the_update_hook(models, parity_dtype, engine_host):
    """Replaying DCP decode graphs without the hook (skipped in the workers) would run the
    capture's tasks, whose slot mapping (made fresh each step here) was freed after the
    capture: the workers refuse
    the replay (a device would write the new K/V through reused memory). Synchronous
    scheduling: under async scheduling vLLM 0.33's multiprocessing executor reports a
    worker's execute_model exception as a KeyError in the scheduler's update, not as the
    worker's error (the worker still logs the refusal)."""
    path = models("llama-mqa")
    prompts = [random_prompt(90 + i, n, vocab(path)) for i, n in enumerate((30, 200))]
    error = engine_host.run(_replay_without_the_update_hook, path, parity_dtype, prompts)
    assert error is not None and "task _npu_reshape_and_cache points at a freed " \
        "torch.int32 tensor" in error, error


# ------------------------------------------------------------- prefill context parallel


@pytest.mark.parametrize("model,tp", [("llama", 1), ("llama", 2), ("mla-small", 1),
                                      ("mla-dsv3", 2)])
def test_pcp2_matches_hf(tiny_models, models, parity_dtype, engine_host, model, tp):
    """--prefill-context-parallel-size 2: each PCP rank runs the model on its chunk of
    every batch's tokens; every rank stored every token (the cache is replicated) and, on
    the paged backend, attended about half of the query rows. MLA: vLLM's MLA layer
    gathers the chunks' latents, the backend attends the rank's pieces."""
    path = tiny_models["llama"] if model == "llama" else models(model)
    computed, stats = _run_workload(engine_host, path, parity_dtype, 110,
                                    tensor_parallel_size=tp, prefill_context_parallel_size=2)
    total = sum(len(r) for r in computed)
    assert len(stats) == 2 * tp
    for s in stats:
        assert s["cudagraph_mode"] == "NONE"
        assert s["stored"] == 2 * total  # every token, both layers, on every rank
        if model == "llama":  # the PCP ranks split the query rows (+ a stand-in row)
            assert 0.4 * total < s["query_rows"] / 2 < 0.65 * total
