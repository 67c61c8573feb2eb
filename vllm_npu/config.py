"""The plugin's options, from vLLM's ``--additional-config`` JSON, parsed once and validated.

    vllm serve M --device npu --additional-config '{"decode_attention_op": "fused_infer_attention"}'

An unknown key or a bad value is a startup error that names the key and what is valid.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)


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


class EplbOptions(BaseModel):
    """The NPU EPLB runtime (`"eplb": {...}`; vllm_npu/eplb/runtime/updator.py)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Placement policy, one of vllm_npu.eplb.available_policies().
    policy: str = "lookahead"
    # The policy's tuning options (numbers), e.g. {"move_budget": 0.2} for "lookahead";
    # vllm_npu.eplb.policy.policy_options(name) lists them with their defaults.
    policy_options: dict[str, float] = {}
    # MoE layers whose experts move per engine step while a rebalance migrates.
    layers_per_step: int = Field(default=1, ge=1)
    # A layer whose weight transfer takes longer is rolled back (old placement kept).
    transfer_timeout_s: float = Field(default=30.0, gt=0)
    # The window reaches the policy as this many consecutive sub-windows (its drift).
    sub_windows: int = Field(default=8, ge=1)
    # Totals of this many earlier windows go with it (the policy's memory lives here).
    history_windows: int = Field(default=8, ge=0)
    # The policy's time per rebalance: past it, layers not yet planned keep a quick plan.
    plan_deadline_s: float = Field(default=0.5, gt=0)
    # Copied by the platform from vLLM's --enable-eplb / --eplb-config (vLLM's own EPLB
    # stays off on the NPU; see NPUPlatform._take_over_eplb).
    enabled: bool = False
    num_redundant_experts: int = Field(default=0, ge=0)
    window_size: int = Field(default=1000, gt=0)
    step_interval: int = Field(default=3000, gt=0)
    log_balancedness: bool = False
    log_balancedness_interval: int = Field(default=1, gt=0)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from vllm_npu.eplb.policy import available_policies

        if name not in available_policies():
            raise ValueError(f"unknown EPLB policy; valid: {available_policies()}")
        return name

    @model_validator(mode="after")
    def _known_options(self) -> "EplbOptions":
        if not self.policy_options:  # nothing to check: the policy's module (scipy, numba:
            return self              # ~0.6 s) is imported only where EPLB runs
        from vllm_npu.eplb.policy import get_policy

        get_policy(self.policy, **self.policy_options)  # raises naming the bad option
        return self


class NPUConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Route norm / rotary / activation layers through the NPU op surface (CustomOp OOT).
    enable_custom_ops: bool = True
    # Kernel for batches that are pure decode: ATB `_npu_paged_attention` (what vllm-ascend
    # uses) or the fused-infer-attention op that also serves prefill and mixed batches.
    decode_attention_op: Literal["paged_attention", "fused_infer_attention"] = "paged_attention"
    moe: MoEOptions = MoEOptions()
    eplb: EplbOptions = EplbOptions()

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
                + (f" (valid keys: {sorted(_SECTIONS[err['loc'][0]].model_fields)})"
                   if err["type"] == "extra_forbidden" and err["loc"][0] in _SECTIONS
                   else "")
                for err in e.errors())
            raise ValueError(f"Invalid --additional-config for vllm_npu: {problems}") from None


_SECTIONS = {"moe": MoEOptions, "eplb": EplbOptions}


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
