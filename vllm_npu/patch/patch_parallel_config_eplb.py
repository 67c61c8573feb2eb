"""Patch: let vLLM's ParallelConfig accept `--enable-eplb` on the NPU platform.

What: replaces the pydantic "after" validator `ParallelConfig._validate_parallel_config`
    with a wrapper that, on the NPU platform with `enable_eplb`, runs vLLM's validator with
    EPLB masked (so its "only supported on CUDA devices or ROCm devices or XPU devices"
    refusal does not fire) and then applies vLLM's two other EPLB checks itself (expert
    parallelism on; TP x PCP x DP > 1) with vLLM's own messages. On every other platform,
    and without `enable_eplb`, vLLM's validator runs untouched.
Why: vLLM 0.33 refuses EPLB when `not current_platform.is_cuda_alike() and not
    current_platform.is_xpu()`, inside the validator that runs when EngineArgs builds the
    ParallelConfig, before any platform hook. The NPU platform runs EPLB itself
    (`vllm_npu.eplb.runtime.updator`; `NPUPlatform.check_and_update_config` takes the flags over),
    and no hook lets a platform declare EPLB support. `is_cuda_alike()` cannot be made
    true: vLLM picks CUDA kernels with it elsewhere.
Applies: whenever the NPU platform is active (device and simulated).
Remove when: vLLM asks the platform whether it supports EPLB (e.g. a platform method)
    instead of testing the platform kind.
"""
from __future__ import annotations

import functools

_MARK = "_vllm_npu_patched"
VALIDATOR = "_validate_parallel_config"


def applies() -> bool:
    return True


def _npu_active() -> bool:
    from vllm.platforms import current_platform

    return type(current_platform).__name__ == "NPUPlatform"


def _check_eplb(cfg) -> None:
    """vLLM's EPLB checks other than the platform one (config/parallel.py)."""
    if not cfg.enable_expert_parallel:
        raise ValueError("enable_expert_parallel must be True to use EPLB.")
    if cfg.tensor_parallel_size * cfg.prefill_context_parallel_size * \
            cfg.data_parallel_size <= 1:
        raise ValueError(
            "EPLB requires tensor, prefill-context, or data parallelism, "
            f"but got TP={cfg.tensor_parallel_size}, "
            f"PCP={cfg.prefill_context_parallel_size}, DP={cfg.data_parallel_size}.")


def apply() -> None:
    import dataclasses

    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig

    original = getattr(ParallelConfig, VALIDATOR, None)
    if original is None or getattr(original, _MARK, False) \
            or VALIDATOR not in ParallelConfig.__pydantic_decorators__.model_validators:
        return  # upstream changed shape (patch obsolete) or already applied

    @functools.wraps(original)
    def validate(self):
        if not (self.enable_eplb and _npu_active()):
            return original(self)
        redundant = self.eplb_config.num_redundant_experts
        self.enable_eplb, self.eplb_config.num_redundant_experts = False, 0
        try:
            result = original(self)
        finally:
            self.enable_eplb, self.eplb_config.num_redundant_experts = True, redundant
        _check_eplb(self)
        return result

    setattr(validate, _MARK, True)
    setattr(ParallelConfig, VALIDATOR, validate)
    # pydantic compiled the validator into the class's schema and into those of the
    # configs that embed a ParallelConfig (SpeculativeConfig; VllmConfig, which revalidates
    # its parallel_config): point the record of the validator at the wrapper and compile
    # the schemas again, embedding classes after the class they embed.
    validators = ParallelConfig.__pydantic_decorators__.model_validators
    validators[VALIDATOR] = dataclasses.replace(validators[VALIDATOR], func=validate)
    for cls in (ParallelConfig, SpeculativeConfig, VllmConfig):
        rebuild_dataclass(cls, force=True)
