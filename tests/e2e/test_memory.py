"""KV-cache sizing on the simulated NPU honours --gpu-memory-utilization against the
simulated capacity (NPU_SIM_MEMORY_GB), as on a device."""
from __future__ import annotations

import pytest

from tests.helpers.engine import make_llm, shutdown

GiB = 1 << 30


def test_kv_blocks_scale_with_gpu_memory_utilization(tiny_models, parity_dtype, monkeypatch):
    monkeypatch.setenv("NPU_SIM_MEMORY_GB", "1")
    path = tiny_models["llama"]
    blocks = {}
    for util in (0.3, 0.6):
        llm = make_llm(path, parity_dtype, gpu_memory_utilization=util,
                       num_gpu_blocks_override=None, max_model_len=512,
                       max_num_batched_tokens=512, enable_sleep_mode=False)
        blocks[util] = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        shutdown(llm)
    # tiny llama: 2 layers x (K, V) x 128 tokens x 2 kv heads x 32 dims x 4 bytes
    page = 2 * 2 * 128 * 2 * 32 * 4
    assert blocks[0.3] * page <= 0.3 * GiB
    assert blocks[0.6] - blocks[0.3] == pytest.approx(0.3 * GiB / page, abs=1)
