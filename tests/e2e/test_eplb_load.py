"""EPLB load recording: the NPU MoE layers count, on the device, the (token, expert) pairs
routed to each physical slot — equal to the counts HF transformers' own router gives for
the same tokens, eagerly and when decode steps replay captured graphs (whose padding rows
are routed too, but are not load)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.engine import generate, make_llm, shutdown, vocab
from tests.helpers.reference import random_prompt


def _hf_expert_counts(path: str, tokens: list[int], top_k: int) -> np.ndarray:
    """[layers, experts]: how often HF's router picks each expert over `tokens`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(torch.tensor([tokens]), output_router_logits=True)
    counts = [torch.bincount(logits.topk(top_k, dim=-1).indices.flatten(),
                             minlength=logits.shape[-1]).numpy()
              for logits in out.router_logits]
    return np.stack(counts)


@pytest.fixture(scope="module")
def qwen_moe(tmp_path_factory) -> str:
    from vllm_npu.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("eplb") / "qwen3moe"), arch="qwen3_moe")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "full-decode-graphs"])
def test_load_counters_match_hf_router(qwen_moe, float32_only, graphs):
    """Three requests decode together: a batch of 3 replays the graph captured for 4, whose
    padding row routes like a token and must not count."""
    from vllm_npu.compilation.acl_graph import ACLGraphWrapper
    from vllm_npu.eplb.runtime.adaptor import VllmEplbAdaptor

    prompts = [random_prompt(77 + i, n, vocab(qwen_moe)) for i, n in enumerate((40, 9, 23))]
    llm = make_llm(qwen_moe, float32_only, enforce_eager=not graphs, enable_sleep_mode=False,
                   enable_prefix_caching=False)
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        adaptor = VllmEplbAdaptor(runner.get_model())
        adaptor.reset_load()  # drop the profile / warm-up / capture runs
        replayed = dict(ACLGraphWrapper.stats.replayed_sizes)
        generated = generate(llm, prompts, 8)
        load = adaptor.logical_load()
        replayed = {n: k - replayed.get(n, 0)
                    for n, k in ACLGraphWrapper.stats.replayed_sizes.items()}
    finally:
        shutdown(llm)
    assert adaptor.layer_ids == [0, 1]
    if graphs:
        assert replayed.get(4, 0) > 0  # the padded batch really ran
    # every token that went through the layers: the prompt, and each output but the last
    expected = sum(_hf_expert_counts(qwen_moe, p + g[:-1], top_k=2)
                   for p, g in zip(prompts, generated))
    np.testing.assert_array_equal(load, expected)
