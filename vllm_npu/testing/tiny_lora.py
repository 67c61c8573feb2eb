"""A PEFT-format LoRA adapter for a tiny local model, random and deterministic: what the
LoRA tests serve (`--enable-lora`, `LoRARequest`) and merge into HF weights as the
reference (W' = W + alpha / r * B @ A).

    adapter_config.json          peft_type LORA, r, lora_alpha, target_modules, ...
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight [r, in]
                                 base_model.model.<module>.lora_B.weight [out, r]
"""
from __future__ import annotations

import json
import os

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_tiny_lora(base: str, path: str, seed: int, rank: int = 8, alpha: int = 16,
                    targets: tuple[str, ...] = TARGETS, std: float = 0.15) -> str:
    if os.path.exists(os.path.join(path, "adapter_config.json")):
        return path
    import torch
    from safetensors.torch import load_file, save_file

    weights = {}
    for file in sorted(f for f in os.listdir(base) if f.endswith(".safetensors")):
        weights.update(load_file(os.path.join(base, file)))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, w in sorted(weights.items()):
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module is None or w.dim() != 2 or module.rsplit(".", 1)[-1] not in targets:
            continue
        out_f, in_f = w.shape
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * std
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * std
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                   "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
                   "lora_dropout": 0.0, "fan_in_fan_out": False, "use_rslora": False,
                   "modules_to_save": None, "base_model_name_or_path": base}, f, indent=1)
    return path
