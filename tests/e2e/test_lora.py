"""Multi-LoRA on the simulated NPU (`--enable-lora`, two adapters and the base model in one
batch, `--max-loras 2`) vs HF transformers with each adapter merged into the weights
(W + alpha / r * B @ A, by hand), greedy tokens equal; eager and under the default
FULL_DECODE_ONLY graphs, where decode replays read each step's adapter indices."""
from __future__ import annotations

import functools
import json
import os

import pytest
import torch

from tests.helpers.engine import make_llm, shutdown, vocab
from tests.helpers.reference import greedy, random_prompt
from vllm_npu.compilation.acl_graph import ACLGraphWrapper


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_lora import build_tiny_lora

    root = tmp_path_factory.mktemp("lora")
    base = tiny_models["llama"]
    return {"a1": build_tiny_lora(base, str(root / "a1"), 1),
            "a2": build_tiny_lora(base, str(root / "a2"), 2, rank=4, alpha=8)}


@functools.cache
def _merged(base: str, adapter: str | None):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is None:
        return model
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        config = json.load(f)
    tensors = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    with torch.no_grad():
        for key, a in tensors.items():
            if key.endswith(".lora_A.weight"):
                module = key[len("base_model.model."):-len(".lora_A.weight")]
                b = tensors[key.replace("lora_A", "lora_B")]
                model.get_submodule(module).weight += config["lora_alpha"] / config["r"] * (b @ a)
    return model


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_two_adapters_and_the_base_in_one_batch_match_merged_hf(tiny_models, adapters,
                                                                 float32_only, mode):
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    base = tiny_models["llama"]
    prompts = [random_prompt(50 + i, n, vocab(base)) for i, n in enumerate((7, 40, 90))]
    requests = [None, LoRARequest("a1", 1, adapters["a1"]),
                LoRARequest("a2", 2, adapters["a2"])]
    jobs = [(p, r) for p in prompts for r in requests]
    llm = make_llm(base, float32_only, enable_lora=True, max_loras=2, max_lora_rank=8,
                   enforce_eager=mode == "eager")
    try:
        before = ACLGraphWrapper.stats.replays
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in jobs],
                            SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                            lora_request=[r for _, r in jobs], use_tqdm=False)
        replays = ACLGraphWrapper.stats.replays - before
    finally:
        shutdown(llm)
    got = {(i, r and r.lora_name): list(o.outputs[0].token_ids)
           for (i, (_, r)), o in zip(enumerate(jobs), outs)}
    for i, (prompt, request) in enumerate(jobs):
        adapter = None if request is None else adapters[request.lora_name]
        assert got[i, request and request.lora_name] == greedy(_merged(base, adapter),
                                                               prompt, 12), (i, request)
    base_tokens = [t for (i, name), t in got.items() if name is None]
    assert all(t not in base_tokens for (i, name), t in got.items() if name)  # LoRA applied
    assert (replays > 0) == (mode == "graph"), replays


def test_lora_on_a_moe_model_is_refused_at_startup(tmp_path):
    from vllm import LLM

    from vllm_npu.testing.tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path / "moe"), arch="qwen3_moe")
    with pytest.raises(ValueError, match="--enable-lora with a MoE model is not supported"):
        LLM(path, dtype="float32", enable_lora=True, max_model_len=256)
