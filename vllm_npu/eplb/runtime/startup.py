"""vLLM's EPLB flags, taken over by the NPU platform at startup.

    vllm serve M --device npu --enable-expert-parallel --enable-eplb \
        --eplb-config '{"num_redundant_experts": 2, "window_size": 100, "step_interval": 300}' \
        --additional-config '{"eplb": {"policy": "lookahead", "layers_per_step": 2}}'

vLLM's flags keep their meaning; the plugin's choices live in the `eplb` additional-config
key. The NPU runs its own runtime (updator.py): vLLM's EplbState expects
`supports_eplb` kernels and vLLM's communicators, so vLLM's EPLB is switched off here and
the settings travel to the workers inside `additional_config["eplb"]`.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vllm_npu.config import NPUConfig

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm.npu")

# vLLM's EPLBConfig fields the runtime follows (use_async, policy and communicator are
# vLLM-internal choices: planning is always off the forward path here, the policy comes
# from the plugin's key, weights move over the NPU communicator).
MIRRORED = ("num_redundant_experts", "window_size", "step_interval", "log_balancedness",
            "log_balancedness_interval")


def take_over_eplb(vllm_config: "VllmConfig") -> NPUConfig:
    """Validate vLLM's EPLB settings for the NPU, move them into the plugin's config and
    turn vLLM's own EPLB off. Returns the plugin config to use."""
    parallel = vllm_config.parallel_config
    eplb = parallel.eplb_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError("--enable-eplb with --pipeline-parallel-size "
                         f"{parallel.pipeline_parallel_size} is not supported on the NPU; "
                         "valid: pipeline parallel size 1")
    model = vllm_config.model_config
    experts = model.get_num_experts() if model is not None else 0
    if not experts:  # (vLLM refuses EP on a dense model first; this covers no model at all)
        raise ValueError("--enable-eplb needs a mixture-of-experts model; "
                         f"{getattr(model, 'model', None)!r} has no routed experts")
    ep = parallel.tensor_parallel_size * parallel.prefill_context_parallel_size * \
        parallel.data_parallel_size
    physical = experts + eplb.num_redundant_experts
    if physical % ep:
        valid = [r for r in range(0, 2 * ep + 1) if (experts + r) % ep == 0]
        raise ValueError(
            f"--eplb-config num_redundant_experts={eplb.num_redundant_experts}: "
            f"{experts} experts + {eplb.num_redundant_experts} redundant = {physical} "
            f"physical experts do not split over {ep} expert-parallel ranks; valid values "
            f"include {valid}")
    if physical // ep > experts:
        raise ValueError(
            f"--eplb-config num_redundant_experts={eplb.num_redundant_experts}: each of "
            f"the {ep} expert-parallel ranks would hold {physical // ep} slots but the model "
            f"has only {experts} experts (a rank holds an expert at most once)")
    raw = dict(vllm_config.additional_config or {})
    section = dict(raw.get("eplb") or {})
    section.update({name: getattr(eplb, name) for name in MIRRORED}, enabled=True)
    raw["eplb"] = section
    npu_config = NPUConfig.from_additional_config(raw)
    vllm_config.additional_config = raw
    parallel.enable_eplb = False
    eplb.num_redundant_experts = 0
    logger.info("vllm_npu: EPLB on the NPU runtime: %d redundant expert(s) over %d EP "
                "ranks, window %d steps, rebalance every %d steps, policy %s, %d layer(s) "
                "migrated per step", npu_config.eplb.num_redundant_experts, ep,
                npu_config.eplb.window_size, npu_config.eplb.step_interval,
                npu_config.eplb.policy, npu_config.eplb.layers_per_step)
    return npu_config
