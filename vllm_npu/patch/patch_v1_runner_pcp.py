"""Patch: let vLLM's V1-runner validation accept prefill context parallelism on the NPU.

What: wraps `VllmConfig._get_v1_model_runner_unsupported_features` so that the entry
    "prefill context parallel" is dropped; every other unsupported feature still stops
    startup.
Why: vLLM 0.33 implements PCP only in its V2 model runner and rejects PCP > 1 for the V1
    runner in `VllmConfig.__post_init__`, after every platform hook has run. The NPU runner
    extends V1 (V2 is built on Triton kernels) and adds PCP itself
    (`NPUModelRunner._pcp_forward`, `attention/prefill_context_parallel.py`); no platform
    hook tells vLLM that a platform's runner supports a feature.
Applies: whenever the NPU platform is active (device and simulated).
Remove when: vLLM asks the platform or its worker which features its runner supports, or
    the NPU runner moves to the V2 runner.
"""
from __future__ import annotations

import functools

_MARK = "_vllm_npu_patched"
FEATURE = "prefill context parallel"


def applies() -> bool:
    return True


def apply() -> None:
    from vllm.config import VllmConfig

    original = getattr(VllmConfig, "_get_v1_model_runner_unsupported_features", None)
    if original is None or getattr(original, _MARK, False):
        return  # upstream changed shape (patch obsolete) or already applied

    @functools.wraps(original)
    def unsupported(self) -> list[str]:
        return [f for f in original(self) if f != FEATURE]

    setattr(unsupported, _MARK, True)
    VllmConfig._get_v1_model_runner_unsupported_features = unsupported
