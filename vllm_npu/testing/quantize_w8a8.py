"""Write a ModelSlim-layout W8A8 / W8A8_DYNAMIC checkpoint from an HF model (deterministic).

Every Linear inside the decoder layers is quantised; embeddings, norms and lm_head stay
FLOAT. The files and formulas are ModelSlim's (its v1 saver; facts and sources in
shared/notes/quant-w8a8-facts.md):

    weights   per output channel, symmetric: w_scale = max|W_row| / 127, W_q = round(W / w_scale)
    W8A8      activations per tensor, asymmetric, calibrated on fixed prompts:
              input_scale = (max - min) / 255, input_offset = round(-min / input_scale) - 128
              deq_scale = input_scale * w_scale (float32; int64 float bits for fp16 models)
              quant_bias = round(bias / deq_scale - rowsum(W_q) * input_offset)   int32
    W8A8_DYNAMIC  weight, weight_scale [n, 1], weight_offset zeros [n, 1]; bias FLOAT

    quant_model_description.json     {tensor name: "W8A8" | "W8A8_DYNAMIC" | "FLOAT", ...,
                                      "model_quant_type", "version", "group_size", ...}
    quant_model_weight_w8a8[_dynamic].safetensors

`fmt="compressed-tensors"` writes vLLM's compressed-tensors int8 layout instead (config.json
`quantization_config`, format "int-quantized"; weights per channel symmetric; activations
per token dynamic, or per tensor static symmetric: input_scale = max|x| / 127).
"""
from __future__ import annotations

import json
import os
import shutil

import torch

SCHEMES = ("W8A8", "W8A8_DYNAMIC")
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja")


def _calibration_batches(vocab: int, seed: int, count: int = 8, length: int = 48):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (1, length), generator=g) for _ in range(count)]


@torch.inference_mode()
def _input_ranges(model, linears: dict[str, torch.nn.Linear], vocab: int, seed: int):
    """Per Linear, the min and max of its input over the calibration prompts."""
    ranges: dict[str, list[float]] = {}
    hooks = []
    for name, module in linears.items():
        def hook(mod, args, name=name):
            x = args[0]
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(name, [lo, hi])
            ranges[name] = [min(old[0], lo), max(old[1], hi)]
        hooks.append(module.register_forward_pre_hook(hook))
    try:
        for ids in _calibration_batches(vocab, seed):
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return ranges


def _float_bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def quantize_checkpoint(src: str, dst: str, scheme: str = "W8A8_DYNAMIC", seed: int = 0,
                        skip: tuple[str, ...] = (), fmt: str = "modelslim") -> str:
    """Quantise `src` (an HF checkpoint) into `dst`; `skip`: name fragments of Linears to
    keep FLOAT (mixed layers)."""
    if fmt == "compressed-tensors":
        return _compressed_tensors(src, dst, scheme, seed, skip)
    if fmt != "modelslim":
        raise ValueError(f"fmt={fmt!r}; valid: 'modelslim', 'compressed-tensors'")
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}; valid: {SCHEMES}")
    if os.path.exists(os.path.join(dst, "quant_model_description.json")):
        return dst
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    dtype = getattr(model.config, "dtype", None) or torch.float32
    linears = {name: m for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.")
               and not any(s in name for s in skip)}
    ranges = _input_ranges(model, linears, model.config.vocab_size, seed) \
        if scheme == "W8A8" else {}
    tensors, description = {}, {}
    for name, t in model.state_dict().items():
        description[name] = "FLOAT"
        tensors[name] = t.detach().clone().contiguous()
    for name, lin in linears.items():
        w = lin.weight.detach().float()
        w_scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        w_q = torch.round(w / w_scale[:, None]).clamp(-128, 127).to(torch.int8)
        out = {"weight": w_q}
        if scheme == "W8A8_DYNAMIC":
            out["weight_scale"] = w_scale[:, None].clone()
            out["weight_offset"] = torch.zeros_like(out["weight_scale"])
        else:
            lo, hi = ranges[name]
            lo, hi = min(lo, 0.0), max(hi, 0.0)
            in_scale = max((hi - lo) / 255, 1e-12)
            in_offset = float(round(-lo / in_scale) - 128)
            deq = (torch.tensor(in_scale, dtype=torch.float32) * w_scale).float()
            bias = lin.bias.detach().float() if lin.bias is not None else torch.zeros_like(deq)
            q_bias = torch.round(bias.double() / deq.double()
                                 - w_q.double().sum(dim=1) * in_offset)
            out.update(input_scale=torch.tensor([in_scale], dtype=torch.float32),
                       input_offset=torch.tensor([in_offset], dtype=torch.float32),
                       deq_scale=_float_bits(deq) if dtype == torch.float16 else deq,
                       quant_bias=q_bias.to(torch.int32))
        for suffix, value in out.items():
            tensors[f"{name}.{suffix}"] = value.contiguous()
            description[f"{name}.{suffix}"] = scheme
        if lin.bias is not None:
            description[f"{name}.bias"] = "FLOAT"  # static: folded into quant_bias as well
    description.update(model_quant_type=scheme, version="1.0.0", group_size=0,
                       kv_quant_type=None, fa_quant_type=None, metadata={})
    os.makedirs(dst, exist_ok=True)
    suffix = "w8a8" if scheme == "W8A8" else "w8a8_dynamic"
    save_file(tensors, os.path.join(dst, f"quant_model_weight_{suffix}.safetensors"))
    with open(os.path.join(dst, "quant_model_description.json"), "w") as f:
        json.dump(description, f, indent=1)
    for name in COPIED:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)  # as ModelSlim's saver does
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return dst


def _load(src: str, skip: tuple[str, ...]):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    linears = {name: m for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.")
               and not any(s in name for s in skip)}
    return model, linears


def _compressed_tensors(src: str, dst: str, scheme: str, seed: int,
                        skip: tuple[str, ...]) -> str:
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    model, linears = _load(src, skip)
    ranges = _input_ranges(model, linears, model.config.vocab_size, seed) \
        if scheme == "W8A8" else {}
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for name, lin in linears.items():
        w = lin.weight.detach().float()
        w_scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        tensors[f"{name}.weight"] = torch.round(w / w_scale[:, None]).clamp(-128, 127).to(
            torch.int8)
        tensors[f"{name}.weight_scale"] = w_scale[:, None].clone()
        if scheme == "W8A8":
            lo, hi = ranges[name]
            tensors[f"{name}.input_scale"] = torch.tensor(
                [max(abs(lo), abs(hi), 1e-12) / 127], dtype=torch.float32)
    weights = dict(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False)
    inputs = dict(num_bits=8, type="int", symmetric=True,
                  strategy="tensor" if scheme == "W8A8" else "token",
                  dynamic=scheme != "W8A8")
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    for name in COPIED:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = dict(
        quant_method="compressed-tensors", format="int-quantized",
        ignore=["lm_head"] + [n for n, m in model.named_modules()
                              if isinstance(m, torch.nn.Linear) and n not in linears
                              and n != "lm_head"],
        config_groups={"group_0": dict(targets=["Linear"], weights=weights,
                                       input_activations=inputs)})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return dst
