"""The patch registry: every patch documented, applied only where needed, idempotent."""
from __future__ import annotations

import importlib
import os

import vllm_npu.patch as patch_pkg


def test_registry_lists_exactly_the_patch_files():
    folder = os.path.dirname(patch_pkg.__file__)
    files = sorted(f[:-3] for f in os.listdir(folder) if f.startswith("patch_"))
    assert sorted(patch_pkg.PATCHES) == files


def test_every_patch_says_what_why_and_when_it_can_go():
    for name in patch_pkg.PATCHES:
        module = importlib.import_module(f"vllm_npu.patch.{name}")
        doc = module.__doc__ or ""
        for section in ("What:", "Why:", "Remove when:"):
            assert section in doc, f"{name} lacks {section!r}"
        assert callable(module.applies) and callable(module.apply)


def test_cleanup_patch_is_applied_in_simulation_and_idempotent(simulated):
    import vllm.distributed as dist
    import vllm.distributed.parallel_state as ps
    import vllm.v1.engine.core as core

    applied = patch_pkg.apply_all()
    assert ("patch_accelerator_cleanup" in applied) == simulated
    if simulated:
        wrapped = ps.cleanup_dist_env_and_memory
        assert getattr(wrapped, "_vllm_npu_patched", False)
        assert dist.cleanup_dist_env_and_memory is wrapped
        assert core.cleanup_dist_env_and_memory is wrapped
        patch_pkg.apply_all()
        assert ps.cleanup_dist_env_and_memory is wrapped  # not wrapped twice


def test_pcp_patch_drops_only_prefill_context_parallel():
    """vLLM's V1-runner validation keeps refusing everything but PCP."""
    from vllm.config import VllmConfig

    patch_pkg.apply_all()
    method = VllmConfig._get_v1_model_runner_unsupported_features
    assert getattr(method, "_vllm_npu_patched", False)
    cfg = VllmConfig()
    cfg.parallel_config.prefill_context_parallel_size = 2
    upstream = method.__wrapped__(cfg)
    assert "prefill context parallel" in upstream  # vLLM itself refuses PCP on V1
    assert method(cfg) == [f for f in upstream if f != "prefill context parallel"]
    patch_pkg.apply_all()
    assert VllmConfig._get_v1_model_runner_unsupported_features is method  # idempotent


def test_eplb_patch_accepts_enable_eplb_and_keeps_vllms_other_checks():
    """On the NPU, `enable_eplb` passes ParallelConfig; vLLM's EP and world-size checks
    still stop startup with vLLM's messages; without the patch vLLM refuses the platform."""
    import pytest
    from vllm.config import ParallelConfig
    from vllm.config.parallel import EPLBConfig

    patch_pkg.apply_all()
    validator = ParallelConfig._validate_parallel_config
    assert getattr(validator, "_vllm_npu_patched", False)
    cfg = ParallelConfig(enable_eplb=True, enable_expert_parallel=True,
                         tensor_parallel_size=2,
                         eplb_config=EPLBConfig(num_redundant_experts=2))
    assert cfg.enable_eplb and cfg.eplb_config.num_redundant_experts == 2
    with pytest.raises(ValueError, match="enable_expert_parallel must be True to use EPLB"):
        ParallelConfig(enable_eplb=True, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="EPLB requires tensor, prefill-context, or data"):
        ParallelConfig(enable_eplb=True, enable_expert_parallel=True)
    with pytest.raises(ValueError, match="num_redundant_experts is set to 1 but EPLB"):
        ParallelConfig(eplb_config=EPLBConfig(num_redundant_experts=1))
    with pytest.raises(ValueError, match="only supported on CUDA devices"):
        validator.__wrapped__(cfg)  # what vLLM alone says on this platform
    from vllm.config import VllmConfig

    # VllmConfig revalidates its ParallelConfig with the patched validator too, so startup
    # reaches the platform's own EPLB checks (here: there is no model)
    with pytest.raises(ValueError, match="--enable-eplb needs a mixture-of-experts model"):
        VllmConfig(parallel_config=cfg)
    patch_pkg.apply_all()
    assert ParallelConfig._validate_parallel_config is validator  # idempotent
