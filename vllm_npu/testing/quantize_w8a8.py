"""Write a ModelSlim-layout W8A8 / W8A8_DYNAMIC checkpoint from an HF model (deterministic).

The projections inside the decoder layers (`*_proj`, `kv_a_proj_with_mqa`) are quantised;
embeddings, norms, MoE router gates and lm_head stay FLOAT, and so does MLA's `kv_b_proj`
(vLLM folds it into the decode query and output, exact only for float weights). MoE
experts are quantised W8A8_DYNAMIC under either scheme, as ModelSlim writes its W8A8 MoE
checkpoints (static attention, dynamic experts). The files and formulas are ModelSlim's
(its v1 saver; facts and sources in docs/quantization.md):

    weights   per output channel, symmetric: w_scale = max|W_row| / 127, W_q = round(W / w_scale)
    W8A8      activations per tensor, asymmetric, calibrated on fixed prompts:
              input_scale = (max - min) / 255, input_offset = round(-min / input_scale) - 128
              deq_scale = input_scale * w_scale (float32; int64 float bits for fp16 models)
              quant_bias = round(bias / deq_scale - rowsum(W_q) * input_offset)   int32
              weight_scale [n, 1], weight_offset zeros [n, 1] (as ModelSlim writes them)
    W8A8_DYNAMIC  weight, weight_scale [n, 1], weight_offset zeros [n, 1]; bias FLOAT

    quant_model_description.json     {tensor name: "W8A8" | "W8A8_DYNAMIC" | "FLOAT", ...,
                                      "model_quant_type", "version", "group_size", ...}
    quant_model_weight_w8a8[_dynamic].safetensors

Tensors are read from the source's safetensors under their on-disk names (per-expert
`experts.<e>.gate_proj.weight`, ...), as ModelSlim reads HF checkpoints.

`fmt="compressed-tensors"` writes vLLM's compressed-tensors int8 layout instead (config.json
`quantization_config`, format "int-quantized"; weights per channel symmetric; activations
per token dynamic, or per tensor static symmetric: input_scale = max|x| / 127). MoE experts
stay float there (listed in `ignore`).
"""
from __future__ import annotations

import glob
import json
import os
import shutil

import torch

SCHEMES = ("W8A8", "W8A8_DYNAMIC")
FORMATS = ("modelslim", "compressed-tensors")
KEEP_FLOAT = ("kv_b_proj",)
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja")


def _calibration_batches(vocab: int, seed: int, count: int = 8, length: int = 48):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (1, length), generator=g) for _ in range(count)]


@torch.inference_mode()
def _input_ranges(src: str, names: list[str], seed: int) -> dict[str, list[float]]:
    """Per Linear (module name), the min and max of its input over the calibration prompts."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ranges: dict[str, list[float]] = {}
    hooks = []
    for name in names:
        def hook(mod, args, name=name):
            x = args[0]
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(name, [lo, hi])
            ranges[name] = [min(old[0], lo), max(old[1], hi)]
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        for ids in _calibration_batches(model.config.vocab_size, seed):
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return ranges


def _float_bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _source(src: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors.update(load_file(file))
    if not tensors:
        raise ValueError(f"{src} holds no safetensors weights")
    return tensors


def _projections(tensors: dict[str, torch.Tensor], skip: tuple[str, ...]) -> list[str]:
    """Module names of the decoder layers' projections to quantise."""
    out = []
    for key, t in tensors.items():
        if not (key.startswith("model.layers.") and key.endswith(".weight") and t.dim() == 2):
            continue
        name = key[:-len(".weight")]
        leaf = name.rsplit(".", 1)[-1]
        if (leaf.endswith("_proj") or leaf == "kv_a_proj_with_mqa") and \
                not any(s in name for s in skip + KEEP_FLOAT):
            out.append(name)
    return out


def _is_expert(name: str) -> bool:
    return ".experts." in name


def _quantise_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    w_scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(w / w_scale[:, None]).clamp(-128, 127).to(torch.int8), w_scale


def quantize_checkpoint(src: str, dst: str, scheme: str = "W8A8_DYNAMIC", seed: int = 0,
                        skip: tuple[str, ...] = (), fmt: str = "modelslim") -> str:
    """Quantise `src` (an HF checkpoint) into `dst`; `skip`: name fragments of Linears to
    keep FLOAT (mixed layers)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}; valid: {SCHEMES}")
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}; valid: {FORMATS}")
    if fmt == "compressed-tensors":
        return _compressed_tensors(src, dst, scheme, seed, skip)
    if os.path.exists(os.path.join(dst, "quant_model_description.json")):
        return dst
    from safetensors.torch import save_file

    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    fp16 = (config.get("dtype") or config.get("torch_dtype")) == "float16"
    tensors = _source(src)
    linears = _projections(tensors, skip)
    static = [n for n in linears if not _is_expert(n)] if scheme == "W8A8" else []
    ranges = _input_ranges(src, static, seed) if static else {}
    description = {name: "FLOAT" for name in tensors}
    out_tensors = dict(tensors)
    for name in linears:
        w_q, w_scale = _quantise_weight(tensors[f"{name}.weight"])
        bias = tensors.get(f"{name}.bias")
        layer_scheme = "W8A8" if name in ranges else "W8A8_DYNAMIC"
        out = {"weight": w_q}
        if layer_scheme == "W8A8_DYNAMIC":
            out["weight_scale"] = w_scale[:, None].clone()
            out["weight_offset"] = torch.zeros_like(out["weight_scale"])
        else:
            lo, hi = ranges[name]
            lo, hi = min(lo, 0.0), max(hi, 0.0)
            in_scale = max((hi - lo) / 255, 1e-12)
            in_offset = float(round(-lo / in_scale) - 128)
            deq = (torch.tensor(in_scale, dtype=torch.float32) * w_scale).float()
            b = bias.float() if bias is not None else torch.zeros_like(deq)
            q_bias = torch.round(b.double() / deq.double()
                                 - w_q.double().sum(dim=1) * in_offset)
            out.update(weight_scale=w_scale[:, None].clone(),
                       weight_offset=torch.zeros(w_scale.shape[0], 1),
                       input_scale=torch.tensor([in_scale], dtype=torch.float32),
                       input_offset=torch.tensor([in_offset], dtype=torch.float32),
                       deq_scale=_float_bits(deq) if fp16 else deq,
                       quant_bias=q_bias.to(torch.int32))
        for suffix, value in out.items():
            out_tensors[f"{name}.{suffix}"] = value.contiguous()
            description[f"{name}.{suffix}"] = layer_scheme
        # a static layer's bias is folded into quant_bias as well; it stays FLOAT
    description.update(model_quant_type=scheme, version="1.0.0", group_size=0,
                       kv_quant_type=None, fa_quant_type=None, metadata={})
    os.makedirs(dst, exist_ok=True)
    suffix = "w8a8" if scheme == "W8A8" else "w8a8_dynamic"
    save_file(out_tensors, os.path.join(dst, f"quant_model_weight_{suffix}.safetensors"))
    with open(os.path.join(dst, "quant_model_description.json"), "w") as f:
        json.dump(description, f, indent=1)
    _copy_config(src, dst, None)  # ModelSlim's saver drops quantization_config
    return dst


def _copy_config(src: str, dst: str, quantization_config: dict | None) -> None:
    for name in COPIED:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def _compressed_tensors(src: str, dst: str, scheme: str, seed: int,
                        skip: tuple[str, ...]) -> str:
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    tensors = _source(src)
    projections = _projections(tensors, skip)
    linears = [n for n in projections if not _is_expert(n)]
    ranges = _input_ranges(src, linears, seed) if scheme == "W8A8" else {}
    out_tensors = dict(tensors)
    for name in linears:
        w_q, w_scale = _quantise_weight(tensors[f"{name}.weight"])
        out_tensors[f"{name}.weight"] = w_q
        out_tensors[f"{name}.weight_scale"] = w_scale[:, None].clone()
        if scheme == "W8A8":
            lo, hi = ranges[name]
            out_tensors[f"{name}.input_scale"] = torch.tensor(
                [max(abs(lo), abs(hi), 1e-12) / 127], dtype=torch.float32)
    weights = dict(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False)
    inputs = dict(num_bits=8, type="int", symmetric=True,
                  strategy="tensor" if scheme == "W8A8" else "token",
                  dynamic=scheme != "W8A8")
    kept = sorted({k[:-len(".weight")] for k, t in tensors.items()
                   if k.startswith("model.layers.") and k.endswith(".weight") and t.dim() == 2
                   and k[:-len(".weight")] not in linears and not _is_expert(k)})
    experts = sorted({k.split(".experts.")[0] + ".experts" for k in tensors if _is_expert(k)})
    os.makedirs(dst, exist_ok=True)
    save_file(out_tensors, os.path.join(dst, "model.safetensors"))
    _copy_config(src, dst, dict(
        quant_method="compressed-tensors", format="int-quantized",
        ignore=["lm_head"] + kept + experts,
        config_groups={"group_0": dict(targets=["Linear"], weights=weights,
                                       input_activations=inputs)}))
    return dst
