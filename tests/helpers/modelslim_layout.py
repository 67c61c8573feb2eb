"""A W8A8 (static) checkpoint laid out as ModelSlim (msmodelslim) writes it, from the
documented schema only: written apart from vllm_npu.testing.quantize_w8a8, so that a
misreading shared by our writer and our loader cannot hide itself.

Two savers users meet (sources in tests/e2e/test_modelslim_layout.py):

    "ascendv1"  today's `ascendv1_saver` (msmodelslim v1, `on_w8a8_static`): per Linear
                weight int8 [n, k], quant_bias int32 [n], input_scale and input_offset
                float32 [1], deq_scale [n] float32 for a bfloat16 model and int64 otherwise,
                no weight_scale / weight_offset; shards quant_model_weights-0000i-of-0000N
                .safetensors with quant_model_weights.safetensors.index.json; description
                top-level keys version "1.0.0", model_quant_type, metadata, group_size,
                optional.
    "v0"        the layout of ModelSlim's "quantized weight format" page and MindIE's W8A8
                page: input_scale and input_offset in the model's dtype [1], deq_scale int64
                (float16 model) / float32 (bfloat16), quant_bias int32 [n]; the v0 saver
                also writes weight_scale / weight_offset [n, 1] float32 for W8A8; one file
                quant_model_weight_w8a8.safetensors; description key model_quant_type.

Quantisation as ModelSlim's W8A8 recipe: activations per tensor, asymmetric, min-max
calibrated on text in the model's dtype; weights per output channel, symmetric, min-max:

    scale = max(max, 0) / 255 - min(min, 0) / 255     offset = round(-min(min, 0) / scale) - 128
    w_scale = max|W_row| / 127                         W_q = clamp(round(W / w_scale), -128, 127)
    deq_scale = input_scale * w_scale (float32)
    quant_bias = round(bias / deq_scale - rowsum(W_q) * offset)   (int32)
    int64 deq_scale: the float32 bits read as int32, widened to int64 (numpy astype: sign-extended)

Scales are computed in float32 from the min / max seen in the model's dtype (ModelSlim's
calculate_int_qparam works in the observer's dtype; the stored layout is what matters here).
"""
from __future__ import annotations

import glob
import json
import os
import random
import shutil

import torch

from vllm_npu.testing.tiny_model import CORPUS_WORDS  # the tiny tokenizer's training words

SAVERS = ("ascendv1", "v0")
EPS = torch.finfo(torch.float32).eps
# ModelSlim's copy_files: the source's .json/.py/.txt/.jinja files, not its weight index
COPIED_SUFFIXES = (".json", ".py", ".txt", ".jinja")


def deq_scale_as_stored(deq: torch.Tensor, model_dtype: torch.dtype) -> torch.Tensor:
    """float32 for bfloat16 models, else int64 holding the float32 bits (deqscale2int64)."""
    deq = deq.to(torch.float32).contiguous()
    if model_dtype == torch.bfloat16:
        return deq
    return deq.view(torch.int32).to(torch.int64)  # sign-extending, as numpy's astype


def _calibration_text(seed: int = 7, sentences: int = 8) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(30, 90)))
            for _ in range(sentences)]


@torch.inference_mode()
def _calibrate(model, tokenizer, names: list[str]) -> dict[str, tuple[float, float]]:
    """Per Linear, the min and max of its input over the calibration text (model dtype)."""
    seen: dict[str, tuple[float, float]] = {}
    hooks = []
    for name in names:
        def hook(_module, args, name=name):
            lo, hi = float(args[0].min()), float(args[0].max())
            old_lo, old_hi = seen.get(name, (lo, hi))
            seen[name] = (min(lo, old_lo), max(hi, old_hi))
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        for text in _calibration_text():
            model(torch.tensor([tokenizer(text).input_ids]))
    finally:
        for h in hooks:
            h.remove()
    return seen


def _static_w8a8(weight: torch.Tensor, bias: torch.Tensor | None, lo: float, hi: float,
                 model_dtype: torch.dtype, saver: str) -> dict[str, torch.Tensor]:
    w = weight.float()
    w_scale = torch.clamp(torch.maximum(-w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0))
                          / 127, min=EPS)
    w_q = torch.round(w / w_scale[:, None]).clamp(-128, 127)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi / 255 - lo / 255, EPS)
    offset = float(round(-lo / scale) - 128)
    # v0 stores the activation parameters in the model's dtype: deq_scale comes from those
    act_dtype = torch.float32 if saver == "ascendv1" else model_dtype
    input_scale = torch.tensor([scale], dtype=act_dtype)
    input_offset = torch.tensor([offset], dtype=act_dtype)
    deq = input_scale.float() * w_scale
    b = torch.zeros(w.shape[0]) if bias is None else bias.float()
    quant_bias = torch.round(b / deq - w_q.sum(dim=1) * input_offset.float())
    out = {"weight": w_q.to(torch.int8), "quant_bias": quant_bias.to(torch.int32),
           "input_scale": input_scale, "input_offset": input_offset,
           "deq_scale": deq_scale_as_stored(deq, model_dtype)}
    if saver == "v0":
        out["weight_scale"] = w_scale[:, None].clone()
        out["weight_offset"] = torch.zeros(w.shape[0], 1)
    return out


def _write_shards(tensors: dict[str, torch.Tensor], dst: str, saver: str,
                  shard_bytes: int) -> None:
    """ascendv1: BufferedSafetensorsWriter's shards and index; v0: one file."""
    from safetensors.torch import save_file

    if saver == "v0":
        save_file(tensors, os.path.join(dst, "quant_model_weight_w8a8.safetensors"))
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes >= shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"quant_model_weights-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(dst, name))
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(dst, "quant_model_weights.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _copy_config(src: str, dst: str, model_dtype: torch.dtype) -> None:
    for path in glob.glob(os.path.join(src, "*")):
        if path.endswith(COPIED_SUFFIXES) and not path.endswith("index.json"):
            shutil.copy(path, dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)  # remove_quantization_config
    # the "original" checkpoint is the model in model_dtype, as published models are
    for key in ("dtype", "torch_dtype"):
        config[key] = str(model_dtype).removeprefix("torch.")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def write_modelslim_w8a8(src: str, dst: str, model_dtype: torch.dtype, saver: str,
                         shard_bytes: int = 1 << 18) -> str:
    """`src` (an HF float checkpoint) loaded in `model_dtype`, its decoder projections
    quantised W8A8 (static) and written to `dst` as `saver` lays them out."""
    if saver not in SAVERS:
        raise ValueError(f"saver={saver!r}; valid: {SAVERS}")
    if os.path.exists(os.path.join(dst, "quant_model_description.json")):
        return dst
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=model_dtype).eval()
    linears = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in name]
    ranges = _calibrate(model, AutoTokenizer.from_pretrained(src), linears)
    tensors: dict[str, torch.Tensor] = {}
    description: dict[str, object] = {}
    if saver == "v0":
        description["model_quant_type"] = "W8A8"
    quantised = {}
    for name in linears:
        module = model.get_submodule(name)
        quantised[name] = _static_w8a8(module.weight.detach(), module.bias, *ranges[name],
                                       model_dtype, saver)
    for key, value in model.state_dict().items():  # module order, as the saver walks
        module, _, leaf = key.rpartition(".")
        if module not in quantised:
            tensors[key], description[key] = value.contiguous(), "FLOAT"
        elif leaf == "weight":
            for param, q in quantised[module].items():
                tensors[f"{module}.{param}"] = q.contiguous()
                description[f"{module}.{param}"] = "W8A8"
        else:  # the float bias stays beside quant_bias (which already holds it), FLOAT
            tensors[key], description[key] = value.float().contiguous(), "FLOAT"
    if saver == "ascendv1":
        description.update(version="1.0.0", model_quant_type="W8A8", metadata={},
                           group_size=0, optional={})
    os.makedirs(dst, exist_ok=True)
    _write_shards(tensors, dst, saver, shard_bytes)
    _copy_config(src, dst, model_dtype)
    with open(os.path.join(dst, "quant_model_description.json"), "w") as f:
        json.dump(description, f, indent=2)
    return dst
