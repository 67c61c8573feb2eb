"""Parity in the device's dtypes: engines in bfloat16 and float16 (vLLM's default graph
mode, so the dtype and alignment rules of every simulated op and graph task are active)
against HF transformers in the same dtype, under teacher forcing (tests/helpers/
agreement.py: top-1 agreement and the logprob gap, mean and maximum).

Thresholds were chosen on prompt seeds 1-6 and are checked here on seeds 11-16.
Seeds 1-6 measured, top-1 / mean / max |Δ logprob| (2026-12-05):
- llama bf16: 0.993 / 0.0077 / 0.045
- deepseek_v3 bf16 (MLA, latent 512 + rope 64, 4 heads padded to 8): 0.944 / 0.0078 / 0.031
- deepseek_v3 fp16 (the same; its prefill runs in bf16, the dense TND form's dtype):
  1.000 / 0.0019 / 0.008
- qwen3_moe bf16: 0.951 / 0.0169 / 0.896

qwen3_moe's maximum is unbounded by design: a bf16 rounding can flip one token's expert
choice, which moves its logits discontinuously. deepseek_v3's bf16 top-1 sits lower than
its logprob gap suggests: the random model has near ties that one bf16 rounding flips.
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.agreement import measure

# (arch, dtype) -> (min top-1 agreement, max mean |Δ logprob|, max |Δ logprob| or None)
THRESHOLDS = {
    ("llama", "bfloat16"): (0.95, 0.02, 0.1),
    ("deepseek_v3", "bfloat16"): (0.9, 0.02, 0.1),
    ("deepseek_v3", "float16"): (0.95, 0.01, 0.05),
    ("qwen3_moe", "bfloat16"): (0.9, 0.05, None),
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("dtypes")
    return functools.cache(lambda arch: build_tiny_model(str(root / arch), arch=arch))


def hf_model(path: str, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


@pytest.mark.parametrize("arch,dtype", list(THRESHOLDS), ids=[f"{a}-{d}" for a, d in THRESHOLDS])
def test_engine_agrees_with_hf_in_the_device_dtype(build, arch, dtype):
    path = build(arch)
    got = measure(path, dtype, hf_model(path, dtype))
    assert got.replays > 0  # decode steps replayed the default FULL_DECODE_ONLY graphs
    assert got.meets(*THRESHOLDS[arch, dtype]), f"{arch} {dtype}: {got}"
