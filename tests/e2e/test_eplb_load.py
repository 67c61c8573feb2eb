"""EPLB load recording: the NPU MoE layers count, on the device, the (token, expert) pairs
routed to each physical slot — equal to the counts HF transformers' own router gives for
the same tokens (eager), and still counted when decode steps replay captured graphs."""
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
def test_load_counters_match_hf_router(qwen_moe, parity_dtype, graphs):
    from vllm_npu.eplb.runtime.adaptor import VllmEplbAdaptor

    prompt = random_prompt(77, 40, vocab(qwen_moe))
    llm = make_llm(qwen_moe, parity_dtype, enforce_eager=not graphs, enable_sleep_mode=False,
                   enable_prefix_caching=False)
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        adaptor = VllmEplbAdaptor(runner.get_model())
        adaptor.reset_load()  # drop the profile / warm-up / capture runs
        (generated,) = generate(llm, [prompt], 8)
        load = adaptor.logical_load()
    finally:
        shutdown(llm)
    assert adaptor.layer_ids == [0, 1]
    fed = prompt + generated[:-1]  # every token that went through the layers
    expected = _hf_expert_counts(qwen_moe, fed, top_k=2)
    if graphs:  # padded decode batches route their padding rows too: counts only grow
        assert (load >= expected).all() and (load.sum(1) >= 2 * len(fed)).all()
    else:
        np.testing.assert_array_equal(load, expected)
