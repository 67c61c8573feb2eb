"""Offline `LLM.generate` on the NPU platform vs HF transformers, token for token (float32).

One engine per architecture, configured so that every scheduling path is exercised:
prefix caching (shared prefixes of whole 128-token blocks), chunked prefill
(max_num_batched_tokens=64 < prompt lengths), and preemption (a 10-block KV cache for 16
concurrent requests).
"""
from __future__ import annotations

import pytest
import torch

from tests.helpers.engine import generate as _generate
from tests.helpers.engine import make_llm as _make_llm
from tests.helpers.engine import metric as _metric
from tests.helpers.engine import shutdown as _shutdown
from tests.helpers.engine import vocab as _vocab
from tests.helpers.reference import hf_greedy, random_prompt, tokenize

BLOCK = 128


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engine(request, tiny_models, parity_dtype):
    path = tiny_models[request.param]
    llm = _make_llm(path, parity_dtype)
    yield request.param, path, llm
    _shutdown(llm)


def test_basic_prompts_match_hf(engine):
    arch, path, llm = engine
    vocab = _vocab(path)
    prompts = [tokenize(path, "hello world the npu runs"),
               tokenize(path, "tokens flow through blocks of cache"),
               random_prompt(1, 1, vocab),            # a single-token prompt
               random_prompt(2, BLOCK - 1, vocab),    # ends just before a block boundary
               random_prompt(3, BLOCK + 1, vocab)]    # crosses it
    got = _generate(llm, prompts, max_tokens=24)
    want = [hf_greedy(path, p, 24) for p in prompts]
    assert got == want


def test_prefix_cache_hits_keep_parity(engine):
    arch, path, llm = engine
    vocab = _vocab(path)
    prefix = random_prompt(10, 2 * BLOCK + 20, vocab)
    prompts = [prefix + random_prompt(11 + i, 5 + 7 * i, vocab) for i in range(3)]
    hits_before = _metric(llm, "vllm:prefix_cache_hits")
    first = _generate(llm, prompts[:1], max_tokens=16)
    rest = _generate(llm, prompts[1:], max_tokens=16)
    hits = _metric(llm, "vllm:prefix_cache_hits") - hits_before
    assert hits >= 2 * 2 * BLOCK  # both later prompts reuse the two full prefix blocks
    assert first + rest == [hf_greedy(path, p, 16) for p in prompts]


def test_chunked_prefill_long_prompt(engine):
    arch, path, llm = engine
    prompt = random_prompt(20, 600, _vocab(path))  # ~10 chunks of 64 tokens
    assert _generate(llm, [prompt], max_tokens=20) == [hf_greedy(path, prompt, 20)]


def test_preemption_keeps_every_request_exact(engine):
    arch, path, llm = engine
    vocab = _vocab(path)
    prompts = [random_prompt(100 + i, 40 + 3 * i, vocab) for i in range(16)]
    before = _metric(llm, "vllm:num_preemptions")
    got = _generate(llm, prompts, max_tokens=100)
    assert _metric(llm, "vllm:num_preemptions") > before  # the tiny KV cache forced it
    assert got == [hf_greedy(path, p, 100) for p in prompts]


def test_sleep_level1_round_trip(engine):
    arch, path, llm = engine
    prompts = [random_prompt(200 + i, 30, _vocab(path)) for i in range(2)]
    before = _generate(llm, prompts, max_tokens=12)
    llm.sleep(level=1)
    llm.wake_up()
    assert _generate(llm, prompts, max_tokens=12) == before


def test_sleep_level2_needs_reload(engine):
    arch, path, llm = engine
    prompts = [random_prompt(300 + i, 30, _vocab(path)) for i in range(2)]
    before = _generate(llm, prompts, max_tokens=12)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    assert _generate(llm, prompts, max_tokens=12) == before


def test_async_scheduling_is_on_and_a_missing_wait_shows(engine, monkeypatch):
    """Every test above ran with async scheduling (vLLM's default, kept on the NPU). The
    simulated NPU runs side-stream copies only when someone waits for them, so an output
    copy read without its event wait yields poison ids, never the right tokens by luck;
    the engine serves correctly again once the wait is back."""
    from vllm_npu.ops.sim import streams

    arch, path, llm = engine
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    prompt = random_prompt(400, 20, _vocab(path))
    monkeypatch.setattr(streams.Event, "synchronize", lambda self: None)
    broken = _generate(llm, [prompt], max_tokens=4)
    monkeypatch.undo()
    assert broken == [[torch.iinfo(torch.int32).max] * 4]
    assert _generate(llm, [prompt], max_tokens=8) == [hf_greedy(path, prompt, 8)]


def test_linear_layers_compute_with_the_simulated_matmul(engine, monkeypatch, float32_only):
    """Every unquantized linear layer of the model is the plugin's replacement
    (layers/linear.py) computing with the simulated device's matmul; with oneDNN
    taken from the first row (normally from 1,024) prefills still match HF. (The K-major
    layout and oneDNN's branch are the float32 simulator's.)"""
    from vllm.model_executor.layers.linear import LinearBase

    from vllm_npu.layers import linear as layers
    from vllm_npu.ops.sim import linear as sim_linear

    arch, path, llm = engine
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert len(linears) == 4 * 2  # qkv, o, gate_up, down per layer
    for m in linears:
        assert type(m).__name__.startswith("NPU"), type(m)
        assert m.quant_method._gemm_impl is layers._device_gemm
        # the device's weight layout (K-major), the parameter's shape unchanged
        w = m.weight
        assert w.shape[0] % 16 == 0 and w.t().is_contiguous() and not w.is_contiguous()
    # the logits projection (vLLM runs it outside the forward): the device's matmul too
    assert type(model.lm_head).__name__ == "NPUParallelLMHead"
    assert type(model.lm_head.quant_method) is layers._DeviceEmbeddingMethod
    calls, heads = [], []
    monkeypatch.setattr(sim_linear, "ONEDNN_MIN_ROWS", 1)
    monkeypatch.setattr(sim_linear, "_onednn", lambda: calls.append(1) or True)
    real_head = sim_linear.device_linear
    monkeypatch.setattr(sim_linear, "device_linear",
                        lambda x, w, b=None: heads.append(x.shape) or real_head(x, w, b))
    prompts = [random_prompt(30 + i, 40 + 50 * i, _vocab(path)) for i in range(3)]
    assert _generate(llm, prompts, max_tokens=8) == [hf_greedy(path, p, 8) for p in prompts]
    assert calls  # the oneDNN branch ran
    assert len(heads) >= 8 and all(shape[-1] == model.lm_head.weight.shape[1]
                                   for shape in heads)  # a projection per step


def test_greedy_tokens_come_from_the_native_argmax(engine, monkeypatch):
    """The runner's sampler is the simulated NPU's (worker/sampler.py): every greedy step's
    tokens come from the native argmax, and still match HF."""
    from vllm_npu.ops.sim import index_kernels
    from vllm_npu.worker.sampler import SimSampler

    arch, path, llm = engine
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert type(runner.sampler) is SimSampler
    rows = []
    real = index_kernels.argmax_rows
    monkeypatch.setattr(index_kernels, "argmax_rows", lambda x: rows.append(x.shape) or real(x))
    prompts = [random_prompt(70 + i, 12 + 9 * i, _vocab(path)) for i in range(3)]
    assert _generate(llm, prompts, max_tokens=6) == [hf_greedy(path, p, 6) for p in prompts]
    assert len(rows) >= 6 and all(shape[1] == _vocab(path) for shape in rows)
