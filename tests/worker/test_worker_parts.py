"""Worker pieces that need no engine: scoped accelerator no-ops and the sleep state."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.worker.accelerator import npu_runtime
from vllm_npu.worker.sleep import SleepState


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a CPU-only torch")
def test_accelerator_noops_are_scoped():
    with pytest.raises(RuntimeError, match="accelerator"):
        torch.accelerator.empty_cache()
    with npu_runtime():
        with npu_runtime():  # re-entrant
            torch.accelerator.synchronize()
        torch.accelerator.empty_cache()
        torch.accelerator.empty_host_cache()
    with pytest.raises(RuntimeError, match="accelerator"):
        torch.accelerator.empty_cache()  # restored outside


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("table", torch.arange(16.0), persistent=False)


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def test_sleep_level1_frees_and_restores_everything():
    torch.manual_seed(0)
    model, kv = _Model(), torch.randn(4, 2, 8)
    weights = model.lin.weight.detach().clone()
    kv_view = kv[1]  # a layer's view into the KV buffer must survive the sleep
    state = SleepState()
    freed = state.sleep(1, model, [kv])
    assert freed == (8 * 8 + 8 + 16) * 4 + kv.numel() * 4
    assert _storage_bytes(model.lin.weight) == 0 and _storage_bytes(kv) == 0
    assert state.is_sleeping
    state.wake_up()
    assert torch.equal(model.lin.weight, weights)
    assert torch.equal(model.table, torch.arange(16.0))
    assert torch.count_nonzero(kv) == 0 and kv_view.data_ptr() == kv[1].data_ptr()
    assert not state.is_sleeping


def test_sleep_level2_keeps_only_buffers_and_tags_wake_separately():
    model, kv = _Model(), torch.randn(4, 2, 8)
    state = SleepState()
    state.sleep(2, model, [kv])
    state.wake_up(["weights"])
    assert torch.equal(model.table, torch.arange(16.0))  # buffers: not in checkpoints
    assert _storage_bytes(model.lin.weight) == 8 * 8 * 4  # resident again, to be reloaded
    assert _storage_bytes(kv) == 0 and state.is_sleeping  # KV still asleep
    state.wake_up(["kv_cache"])
    assert _storage_bytes(kv) == kv.numel() * 4 and not state.is_sleeping


def test_sleep_refuses_bad_levels_tags_and_double_sleep():
    model, kv = _Model(), torch.zeros(2, 2)
    state = SleepState()
    with pytest.raises(ValueError, match="sleep level must be 1 or 2, got 3"):
        state.sleep(3, model, [kv])
    state.sleep(1, model, [kv])
    with pytest.raises(RuntimeError, match="already asleep"):
        state.sleep(1, model, [kv])
    with pytest.raises(ValueError, match="unknown wake-up tag 'gpu'"):
        state.wake_up(["gpu"])
