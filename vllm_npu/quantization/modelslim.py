"""`--quantization ascend`: checkpoints written by Huawei's ModelSlim (msmodelslim).

A ModelSlim checkpoint holds `quant_model_description.json` beside its safetensors: every
tensor name maps to its scheme ("W8A8", "W8A8_DYNAMIC", "FLOAT", ...), plus top-level keys
(`model_quant_type`, `version`, `group_size`, `kv_quant_type`, `fa_quant_type`, `metadata`,
...). The scheme of a Linear is the one of `<prefix>.weight`; a fused vLLM layer
(qkv_proj, gate_up_proj) takes its shards' common scheme. Layout and keys as ModelSlim's
savers write them and vllm-ascend reads them (facts and sources:
docs/quantization.md). The file is read in `maybe_update_config` (vLLM hands
it the model directory), so neither config.json nor the weights' file names matter.
"""
from __future__ import annotations

import json
import os
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from vllm_npu.quantization.w8a8 import W8A8DynamicLinearMethod, W8A8LinearMethod

DESCRIPTION = "quant_model_description.json"
LINEAR_SCHEMES = {"W8A8": W8A8LinearMethod, "W8A8_DYNAMIC": W8A8DynamicLinearMethod}
TOP_LEVEL = ("model_quant_type", "version", "group_size", "kv_quant_type", "kv_cache_type",
             "fa_quant_type", "reduce_quant_type", "metadata", "optional")


def description_path(model: str) -> str | None:
    path = os.path.join(model, DESCRIPTION)
    return path if os.path.isfile(path) else None


@register_quantization_config("ascend")
class AscendModelSlimConfig(QuantizationConfig):
    def __init__(self, description: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.description: dict[str, Any] = {}
        if description is not None:
            self._set(description)

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None) -> None:
        if not self.description:
            self._set(load_description(model_name))

    def _set(self, description: dict[str, Any]) -> None:
        self.description = description
        for key in ("kv_quant_type", "kv_cache_type", "fa_quant_type"):
            if description.get(key) not in (None, "", "FLOAT"):
                raise ValueError(
                    f"{DESCRIPTION}: {key}={description[key]!r} (quantised KV cache / "
                    "attention, e.g. C8) is not supported on the NPU platform yet; the KV "
                    "cache stays in the model dtype. Re-export without KV quantisation.")

    def get_name(self) -> str:
        return "ascend"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # read by maybe_update_config, with a message when it is missing

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AscendModelSlimConfig":
        return cls(config)

    def scheme_of(self, prefix: str) -> str:
        """The scheme of the Linear at `prefix` (a fused layer: its shards' common one)."""
        *parents, name = prefix.split(".")
        shards = self.packed_modules_mapping.get(name, [name])
        schemes = {}
        for shard in shards:
            key = ".".join([*parents, shard, "weight"])
            if key not in self.description:
                raise ValueError(f"{DESCRIPTION} has no entry for {key} (the layer "
                                 f"{prefix}); every weight of the model needs its scheme")
            schemes[key] = self.description[key]
        if len(set(schemes.values())) != 1:
            raise ValueError(f"{DESCRIPTION}: the shards of the fused layer {prefix} have "
                             f"different schemes {schemes}; vLLM runs them as one matmul")
        return next(iter(schemes.values()))

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            scheme = self.scheme_of(prefix)
            if scheme == "FLOAT":
                return UnquantizedLinearMethod()
            if scheme not in LINEAR_SCHEMES:
                raise ValueError(f"{DESCRIPTION}: {prefix}.weight has scheme {scheme!r}; the "
                                 f"NPU platform runs {sorted(LINEAR_SCHEMES)} and FLOAT")
            return LINEAR_SCHEMES[scheme](prefix)
        if isinstance(layer, RoutedExperts):
            experts = [k for k in self.description if k.startswith(prefix + ".")
                       and k.endswith(".weight")]
            schemes = {self.description[k] for k in experts}
            if schemes == {"W8A8_DYNAMIC"}:
                from vllm_npu.quantization.w8a8_moe import NPUW8A8DynamicFusedMoEMethod

                return NPUW8A8DynamicFusedMoEMethod(layer.moe_config, prefix)
            if schemes - {"FLOAT"}:
                raise ValueError(f"{DESCRIPTION}: the experts of {prefix} have schemes "
                                 f"{sorted(schemes)}; the NPU platform runs MoE experts "
                                 "all W8A8_DYNAMIC or all FLOAT (ModelSlim quantises "
                                 "experts dynamically, also in W8A8 checkpoints)")
            return UnquantizedFusedMoEMethod(layer.moe_config)
        return None


def load_description(model: str) -> dict[str, Any]:
    path = description_path(model)
    if path is None:
        raise ValueError(f"--quantization ascend needs {DESCRIPTION} in {model} (a "
                         "ModelSlim checkpoint); this model has none")
    with open(path) as f:
        return json.load(f)
