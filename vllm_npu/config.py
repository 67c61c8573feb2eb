"""The plugin's options, from vLLM's ``--additional-config`` JSON, parsed once and validated.

    vllm serve M --device npu --additional-config '{"decode_attention_op": "fused_infer_attention"}'

An unknown key or a bad value is a startup error that names the key and what is valid.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class MoEOptions(BaseModel):
    """MoE / expert-parallel choices (`"moe": {...}`)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Static logical->physical expert placement (vllm-ascend's expert_map_path format);
    # replicas allowed. None: experts in order, E / ep_size per rank.
    expert_map_path: str | None = None
    # Where EP rank 0 writes the placement in use after loading (same format).
    export_expert_map_path: str | None = None
    # How tokens reach their experts' ranks under expert parallelism: "all_gather"
    # (gather tokens, compute local experts, reduce-scatter; graph-capturable), "all_to_all"
    # (send each token only to its experts' ranks; host-side counts, eager batches only),
    # "auto" (all_to_all for eager batches of at least all_to_all_min_tokens tokens).
    ep_dispatch: Literal["auto", "all_gather", "all_to_all"] = "auto"
    all_to_all_min_tokens: int = Field(default=64, ge=1)


class NPUConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Route norm / rotary / activation layers through the NPU op surface (CustomOp OOT).
    enable_custom_ops: bool = True
    # Kernel for batches that are pure decode: ATB `_npu_paged_attention` (what vllm-ascend
    # uses) or the fused-infer-attention op that also serves prefill and mixed batches.
    decode_attention_op: Literal["paged_attention", "fused_infer_attention"] = "paged_attention"
    moe: MoEOptions = MoEOptions()

    @classmethod
    def from_additional_config(cls, raw: dict[str, Any] | None) -> "NPUConfig":
        raw = dict(raw or {})
        valid = sorted(cls.model_fields)
        unknown = sorted(set(raw) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown --additional-config key(s) {unknown} for vllm_npu; valid keys: {valid}")
        try:
            return cls(**raw)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc']))}={_value_at(raw, err['loc'])!r}: {err['msg']}"
                + (f" (valid keys: {sorted(MoEOptions.model_fields)})"
                   if err["type"] == "extra_forbidden" and err["loc"][0] == "moe" else "")
                for err in e.errors())
            raise ValueError(f"Invalid --additional-config for vllm_npu: {problems}") from None


def _value_at(raw: dict, loc: tuple):
    for key in loc:
        if not isinstance(raw, dict) or key not in raw:
            return None
        raw = raw[key]
    return raw


_current: NPUConfig | None = None


def set_npu_config(config: NPUConfig) -> None:
    global _current
    _current = config


def get_npu_config() -> NPUConfig:
    """The parsed config; defaults when the platform has not parsed one (unit tests)."""
    if _current is None:
        from vllm.config import get_current_vllm_config

        return NPUConfig.from_additional_config(get_current_vllm_config().additional_config)
    return _current
