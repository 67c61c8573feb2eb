"""Tiny DeepSeek-V3-style models (MLA attention, dense layers) on the NPU MLA backend vs HF
transformers, token for token (float32).

One engine per model config: DeepSeek-V3's real attention dims (kv_lora_rank 512, rope 64,
nope 128, v 128) with and without a q LoRA, and small dims. make_llm's
max_num_batched_tokens=64 chunks every longer prompt (the context of later chunks is read
back from the latent cache), batches mix decodes with prefills, and shared 128-token
blocks give prefix-cache hits.
"""
from __future__ import annotations

import pytest

from tests.helpers.engine import generate, make_llm, metric, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt, tokenize
from vllm_npu import ops
from vllm_npu.attention.mla import NPUMLABackend
from vllm_npu.attention.mla_prefill import NPUMLAPrefillBackend

BLOCK = 128
DSV3_ATTN = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
CONFIGS = {
    "dsv3-q-lora": DSV3_ATTN | dict(q_lora_rank=96),
    # 8 heads: the ATB MLA op's own head count, no padding (the others have 4, padded)
    "dsv3-no-q-lora": DSV3_ATTN | dict(q_lora_rank=None, num_attention_heads=8),
    # the tiny default: small nope / value dims, prefill padded to the dense TND form
    "small-nope": dict(qk_nope_head_dim=32, v_head_dim=32),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, tmp_path_factory, parity_dtype):
    from vllm_npu.testing.tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path_factory.mktemp("mla") / request.param),
                            arch="deepseek_v3", **CONFIGS[request.param])
    llm = make_llm(path, parity_dtype)
    yield request.param, path, llm
    shutdown(llm)


def test_engine_uses_npu_mla_backend(engine):
    _, _, llm = engine
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.use_mla
    assert cfg.cache_config.block_size == BLOCK
    layers = cfg.compilation_config.static_forward_context.values()  # in-process engine
    assert layers and {layer.attn_backend for layer in layers} == {NPUMLABackend}
    assert all(isinstance(layer.prefill_backend, NPUMLAPrefillBackend) for layer in layers)


def test_prompts_match_hf(engine, mocker):
    """Short, block-edge and chunked prompts in one batch: prefill, chunked prefill with
    cached context, mixed decode + prefill steps, then pure decode."""
    _, path, llm = engine
    v = vocab(path)
    decode = mocker.spy(ops, "npu_multi_head_latent_attention")
    write = mocker.spy(ops, "_npu_reshape_and_cache")
    prefill = mocker.spy(ops, "npu_fused_infer_attention_score")
    prompts = [tokenize(path, "hello world the npu runs"),
               random_prompt(1, 1, v),             # a single-token prompt
               random_prompt(2, BLOCK - 1, v),     # ends just before a block boundary
               random_prompt(3, BLOCK + 1, v),     # crosses it
               random_prompt(4, 300, v)]           # five 64-token chunks
    got = generate(llm, prompts, 16)
    assert got == [hf_greedy(path, p, 16) for p in prompts]
    assert decode.call_count and write.call_count
    # Some prefill chunk attended to context read back from the cache (kv > q).
    assert any(c.kwargs["actual_seq_lengths_kv"][-1] > c.kwargs["actual_seq_lengths"][-1]
               for c in prefill.call_args_list)


def test_prefix_cache_hits_keep_parity(engine):
    _, path, llm = engine
    v = vocab(path)
    prefix = random_prompt(10, 2 * BLOCK + 20, v)
    prompts = [prefix + random_prompt(11 + i, 5 + 7 * i, v) for i in range(3)]
    hits_before = metric(llm, "vllm:prefix_cache_hits")
    first = generate(llm, prompts[:1], 12)
    rest = generate(llm, prompts[1:], 12)
    assert metric(llm, "vllm:prefix_cache_hits") - hits_before >= 2 * 2 * BLOCK
    assert first + rest == [hf_greedy(path, p, 12) for p in prompts]
