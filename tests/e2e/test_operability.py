"""What a user sees when the model does not fit: the engine stops at startup with the
numbers that did not fit and the options that would change them (the complaint Ascend
users raise most is a bare "Available KV cache memory: -0.87 GiB")."""
from __future__ import annotations

import pytest


def _start(path: str, **kw):
    """Start an engine that is expected to fail; whatever it initialised (the in-process
    distributed state) is torn down, so TP workers forked later start clean. The cleanup is
    looked up once the engine has loaded the plugin: the simulated NPU's patch of it
    (vllm_npu/patch/patch_accelerator_cleanup.py) is applied then, and bound earlier (this
    file run alone) the unpatched one raises on a CPU build of torch."""
    from vllm import LLM

    try:
        return LLM(path, dtype="float32", enforce_eager=True, **kw)
    finally:
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def test_no_memory_left_for_the_kv_cache_names_the_numbers_and_the_options(
        tiny_models, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the error, not a wrapper
    monkeypatch.setenv("NPU_SIM_MEMORY_GB", "0.002")
    with pytest.raises(ValueError, match=r"No NPU memory left for the KV cache: 0\.00 GiB x "
                                         r"gpu_memory_utilization 0\.92 leaves -0\.\d+ GiB "
                                         r"after weights \(0\.\d+ GiB\) and activations") as e:
        _start(tiny_models["llama"])
    for option in ("--gpu-memory-utilization", "--max-num-batched-tokens",
                   "--kv-cache-memory-bytes", "NPU_SIM_MEMORY_GB"):
        assert option in str(e.value)


def test_a_kv_cache_too_small_for_max_model_len_says_what_would_fit(tiny_models,
                                                                    monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(ValueError, match=r"max seq len \(2048\).*estimated maximum model "
                                         r"length is 128.*decreasing `max_model_len`"):
        _start(tiny_models["llama"], kv_cache_memory_bytes=300_000, max_model_len=2048)

