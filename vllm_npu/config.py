"""The plugin's options, from vLLM's ``--additional-config`` JSON, parsed once and validated.

    vllm serve M --device npu --additional-config '{"decode_attention_op": "fused_infer_attention"}'

An unknown key or a bad value is a startup error that names the key and what is valid.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class NPUConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Route norm / rotary / activation layers through the NPU op surface (CustomOp OOT).
    enable_custom_ops: bool = True
    # Kernel for batches that are pure decode: ATB `_npu_paged_attention` (what vllm-ascend
    # uses) or the fused-infer-attention op that also serves prefill and mixed batches.
    decode_attention_op: Literal["paged_attention", "fused_infer_attention"] = "paged_attention"

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
                f"{'.'.join(map(str, err['loc']))}={raw.get(err['loc'][0])!r}: {err['msg']}"
                for err in e.errors())
            raise ValueError(f"Invalid --additional-config for vllm_npu: {problems}") from None


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
