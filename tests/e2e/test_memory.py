"""KV-cache sizing on the simulated NPU, as on a device: the budget is the capacity
(NPU_SIM_MEMORY_GB) x --gpu-memory-utilization - weights - the profile run's peak
activations, each checked against a count made from the model's shapes."""
from __future__ import annotations

from tests.helpers.engine import make_llm, shutdown

GiB = 1 << 30


def test_peak_activations_match_an_independent_count(tiny_models, float32_only, monkeypatch):
    """The profile run's peak activation bytes against a count from the model's shapes
    (tiny llama, float32, T = 4,096 tokens in the profile batch; per token):
    - at least what must be alive while the MLP's activation runs: the residual and the
      normed input [H] each, the gate/up output [2I] and the activation's output [I];
    - at most every activation one decoder layer makes, all alive at once, plus the
      embedding output: input norm, qkv, rotated q and k, attention, o_proj, residual,
      post-attention norm [H, q+2kv, q+kv, q, H, H, H], gate/up, activation, down [2I, I, H].
    A tracker that missed the activations (0) or counted each op's inputs again falls
    outside. The weights are counted from HF's parameters and the KV blocks fill the rest
    of the budget: 1 GiB x 0.5 - weights - activations."""
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("NPU_SIM_MEMORY_GB", "1")
    path, tokens = tiny_models["llama"], 4096
    llm = make_llm(path, float32_only, gpu_memory_utilization=0.5, num_gpu_blocks_override=None,
                   max_num_batched_tokens=tokens, enable_sleep_mode=False, enforce_eager=True)
    try:
        worker = llm.llm_engine.model_executor.driver_worker.worker
        profiled = dict(worker.profiled_bytes)
        blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    finally:
        shutdown(llm)
    c = AutoConfig.from_pretrained(path)
    h, i, d = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    low = tokens * (2 * h + 3 * i) * 4
    high = tokens * (h + (h + q + 2 * kv + q + kv + q + 3 * h) + (3 * i + h)) * 4
    assert low <= profiled["activations"] <= high, (low, profiled, high)
    # HF's parameters, with the vocabulary padded to vLLM's multiple of 64 (embedding and
    # lm_head), plus the rotary cos/sin table [max positions, d] and four scalar
    # attention scales per layer (q, k, v, prob), all float32
    hf = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    padded_vocab = -(-c.vocab_size // 64) * 64
    assert profiled["weights"] == 4 * (hf + 2 * (padded_vocab - c.vocab_size) * h
                                       + c.max_position_embeddings * d
                                       + 4 * c.num_hidden_layers)
    page = c.num_hidden_layers * 2 * 128 * kv * 4  # K and V of 128 tokens, every layer
    left = int(0.5 * GiB) - profiled["weights"] - profiled["activations"]
    assert blocks == left // page


def test_an_engine_takes_its_graphs_and_kv_cache_with_it(tiny_models, float32_only):
    """After an in-process engine's shutdown nothing keeps its captured graphs or its KV
    cache alive: Dynamo keeps every compiled backend (with the piecewise graph wrappers)
    for the life of the process, and the FULL graphs' task registry held the KV cache, so
    a process running engine after engine (a notebook, this test session) kept ~200 MB
    per FULL_AND_PIECEWISE engine of the tiny model (measured 2026-12-07)."""
    import gc
    import weakref

    from tests.helpers.engine import generate
    from tests.helpers.reference import random_prompt
    from vllm_npu.compilation.acl_graph import ACLGraphWrapper

    path = tiny_models["llama"]
    llm = make_llm(path, float32_only, enable_sleep_mode=False,
                   compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE",
                                       "cudagraph_capture_sizes": [1, 2, 4, 8]})
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    mine = [w for w in ACLGraphWrapper._live if w.vllm_config is runner.vllm_config]
    modes = {w.runtime_mode.name for w in mine if w.entries}
    graphs = [weakref.ref(e.graph) for w in mine for e in w.entries.values()]
    kv = [weakref.ref(t) for t in runner.kv_caches]
    del runner, mine
    generate(llm, [random_prompt(5, 20, 256)], 4)
    shutdown(llm)
    del llm
    gc.collect()
    assert modes == {"FULL", "PIECEWISE"} and len(graphs) >= 8 and kv
    assert [r for r in graphs if r() is not None] == []
    assert [r for r in kv if r() is not None] == []
