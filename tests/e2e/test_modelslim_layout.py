"""ModelSlim W8A8 (static) checkpoints as users get them, written from ModelSlim's documented
layout (tests/helpers/modelslim_layout.py), not by our writer (vllm_npu.testing.quantize_w8a8),
loaded in bfloat16 and float16 engines (`--quantization ascend` detected from
quant_model_description.json) and scored against the fake-quant reference in the same
dtype (tests/helpers/reference_quant.py), teacher-forced.

The layout, per quantised Linear (weight [n, k]), and where it is documented:

  weight int8 [n, k]; input_scale, input_offset [1]; quant_bias int32 [n] =
  round(bias / deq_scale - rowsum(W) * input_offset); deq_scale [n] = input_scale *
  weight_scale, int64 (the float32 bits) for float16 models, float32 for bfloat16 ones;
  input_quant = x / input_scale + input_offset, out = (x_q @ W^T + quant_bias) * deq_scale.
  Description: {tensor: "W8A8" | "FLOAT", "model_quant_type": "W8A8", ...}.
    - msmodelslim docs/en/feature_guide/traditional_quantization_v0/quantized_weight_format.md
      (github/gitcode Ascend/msmodelslim): the five W8A8 tensors, dtypes, shapes, formulas,
      "FLOAT" / "W8A8" values and the model_quant_type key.
    - MindIE LLM "W8A8" page, https://www.hiascend.com/document/detail/zh/mindie/230/
      mindiellm/llmdev/mindie_llm0288.html: float16 model -> input_scale / input_offset
      float16, deq_scale int64; bfloat16 model -> bfloat16 / bfloat16, deq_scale float32;
      files quant_model_weight_w8a8.safetensors + quant_model_description.json.
    - msmodelslim msmodelslim/core/quant_service/modelslim_v1/save/ascendv1.py
      (AscendV1Saver.on_w8a8_static, post_run) with save/utils/deqscale.py
      (deqscale2int64_by_dtype: float32 kept for bf16 models, else int64 via
      np.frombuffer(int32).astype(int64)) and save/utils/safetensors.py (shards
      quant_model_weights-0000i-of-0000N.safetensors + .safetensors.index.json): today's
      saver writes input_scale / input_offset as float32, no weight_scale / weight_offset,
      top-level keys version "1.0.0", model_quant_type, metadata, group_size, optional.
    - msmodelslim's v0 (llm_ptq) saver, ComplexQuantifier.generate_weight_of_linear_module:
      W8A8 layers also carry weight_scale / weight_offset.
    - W8A8 recipe (lab_practice yaml qconfig): activations per_tensor, symmetric false,
      minmax; weights per_channel, symmetric, minmax; scale / offset as
      msmodelslim/ir/api/impl/int_quantization.py calculate_int_qparam.
    - vllm-ascend vllm_ascend/quantization/methods/w8a8_static.py (AscendW8A8LinearMethod):
      the reader: deq_scale float32 for bf16 / int64 for fp16, npu_quant_matmul(x_q, W,
      deq_scale, bias=quant_bias), weight_scale / weight_offset declared, not used.

One engine per dtype, each on the layout of one saver: bfloat16 <- ascendv1 (float32
activation parameters, two shards and an index), float16 <- v0 (float16 activation
parameters, int64 deq_scale, weight_scale / weight_offset present). Our loader reads both
as documented; no loader change was needed.

Agreement (tests/helpers/agreement.py's method: the reference scores the engine's greedy
tokens; top-1 / mean / max |Δ logprob|), measured 2026-12-05 on this checkpoint:
    bfloat16 ascendv1  tuning seeds 1-6 0.924 / 0.0521 / 0.198, report 11-16 0.889 / 0.0532 / 0.207
    float16  v0        tuning seeds 1-6 0.931 / 0.0402 / 0.191, report 11-16 0.882 / 0.0413 / 0.143
Thresholds from the tuning seeds: top-1 >= tuning - 0.075, mean <= 1.4 x tuning, max <=
2.5 x tuning (the margins test_quantized.py's LOW_PRECISION cases use: static activations
agree least, the device quantising with the reciprocal scale in the model dtype, the
reference with the exact one). Checked here on the report seeds. A loader that misreads
the layout (int64 bits taken as integers, the scale inverted) scores top-1 near 0.
"""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from tests.helpers.agreement import MAX_TOKENS, REPORT_SEEDS, Agreement
from tests.helpers.engine import greedy_with_logprobs, make_llm, shutdown, vocab
from tests.helpers.modelslim_layout import write_modelslim_w8a8
from tests.helpers.reference import random_prompt, teacher_forced_scores

SAVER = {"bfloat16": "ascendv1", "float16": "v0"}  # engine dtype -> layout it loads
# dtype -> (min top-1, max mean |Δ logprob|, max |Δ logprob|), from the tuning seeds above
THRESHOLDS = {"bfloat16": (0.85, 0.075, 0.5), "float16": (0.85, 0.06, 0.5)}
QUANTISED_PER_LAYER = 4  # vLLM's qkv_proj, o_proj, gate_up_proj, down_proj


def _documented(saver: str, dtype: torch.dtype, n: int, k: int) -> dict:
    """tensor -> (dtype, shape) per quantised Linear, as the sources above give them."""
    act = torch.float32 if saver == "ascendv1" else dtype
    table = {"weight": (torch.int8, (n, k)), "quant_bias": (torch.int32, (n,)),
             "input_scale": (act, (1,)), "input_offset": (act, (1,)),
             "deq_scale": (torch.float32 if dtype == torch.bfloat16 else torch.int64, (n,))}
    if saver == "v0":
        table.update(weight_scale=(torch.float32, (n, 1)), weight_offset=(torch.float32, (n, 1)))
    return table


def _check_files(path: str, saver: str, dtype: torch.dtype) -> None:
    """The writer wrote what the sources document (so the engine is fed that layout)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    names = [os.path.basename(f) for f in files]
    if saver == "ascendv1":
        assert names == [f"quant_model_weights-{i:05d}-of-00002.safetensors" for i in (1, 2)]
        assert os.path.exists(os.path.join(path, "quant_model_weights.safetensors.index.json"))
    else:
        assert names == ["quant_model_weight_w8a8.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
    with open(os.path.join(path, "quant_model_description.json")) as f:
        desc = json.load(f)
    assert desc["model_quant_type"] == "W8A8"
    assert set(desc) - {"model_quant_type", "version", "metadata", "group_size",
                        "optional"} == set(tensors)
    for prefix in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        n, k = tensors[f"{prefix}.weight"].shape
        for leaf, (dt, shape) in _documented(saver, dtype, n, k).items():
            t = tensors[f"{prefix}.{leaf}"]
            assert (t.dtype, tuple(t.shape), desc[f"{prefix}.{leaf}"]) == (dt, shape, "W8A8")
    assert tensors["model.embed_tokens.weight"].dtype == dtype
    assert desc["lm_head.weight"] == "FLOAT"


def _check_engine_layers(llm, dtype: torch.dtype) -> None:
    """Detected as ascend; every decoder Linear runs static W8A8 with the deq_scale form
    npu_quant_matmul takes for this output dtype."""
    from vllm_npu.quantization.w8a8 import W8A8LinearMethod

    assert llm.llm_engine.vllm_config.model_config.quantization == "ascend"
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    layers = [m for m in model.modules()
              if isinstance(getattr(m, "quant_method", None), W8A8LinearMethod)]
    assert len(layers) == QUANTISED_PER_LAYER * model.config.num_hidden_layers
    expected = torch.int64 if dtype == torch.float16 else torch.float32
    assert {(m.weight.dtype, m.deq_scale.dtype) for m in layers} == {(torch.int8, expected)}


@pytest.mark.parametrize("dtype", list(SAVER))
def test_modelslim_checkpoint_agrees_with_the_fake_quant_reference(dtype, tiny_models,
                                                                   tmp_path_factory):
    from tests.helpers.reference_quant import fake_quant_model
    from vllm_npu.compilation.acl_graph import ACLGraphWrapper

    torch_dtype, saver = getattr(torch, dtype), SAVER[dtype]
    path = write_modelslim_w8a8(tiny_models["llama"],
                                str(tmp_path_factory.mktemp("modelslim") / saver),
                                torch_dtype, saver)
    _check_files(path, saver, torch_dtype)
    v = vocab(path)
    prompts = [random_prompt(s, 5 + 37 * (s % 7), v) for s in REPORT_SEEDS]
    llm = make_llm(path, dtype, enable_sleep_mode=False)
    try:
        _check_engine_layers(llm, torch_dtype)
        replays = ACLGraphWrapper.stats.replays
        results = greedy_with_logprobs(llm, prompts, MAX_TOKENS)
        replays = ACLGraphWrapper.stats.replays - replays
    finally:
        shutdown(llm)
    agree, diffs = teacher_forced_scores(fake_quant_model(path, torch_dtype), prompts, results)
    got = Agreement(sum(agree) / len(agree), sum(diffs) / len(diffs), max(diffs), replays)
    print(f"{dtype} {saver}: {got}")
    assert got.replays > 0
    assert got.meets(*THRESHOLDS[dtype]), f"{dtype} {saver}: {got}"
