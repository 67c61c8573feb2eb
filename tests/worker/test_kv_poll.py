"""The worker's pause in vLLM's KV-transfer polling loop (vllm_npu/worker/kv_poll.py): only a
step that ran no tokens and whose poll found nothing pauses, for NPU_KV_IDLE_POLL_MS."""
from __future__ import annotations

from copy import copy
from types import SimpleNamespace

import pytest
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput

from vllm_npu.worker import kv_poll


@pytest.fixture
def sleeps(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(kv_poll.time, "sleep", slept.append)
    monkeypatch.setattr(kv_poll, "has_kv_transfer_group", lambda: True)
    return slept


def step(tokens: int) -> SimpleNamespace:
    return SimpleNamespace(total_num_scheduled_tokens=tokens)


def test_an_empty_poll_pauses(sleeps, monkeypatch):
    monkeypatch.delenv("NPU_KV_IDLE_POLL_MS", raising=False)
    assert kv_poll.pause_if_only_polling(step(0), EMPTY_MODEL_RUNNER_OUTPUT)
    assert sleeps == [0.005]
    monkeypatch.setenv("NPU_KV_IDLE_POLL_MS", "20")
    assert kv_poll.pause_if_only_polling(step(0), EMPTY_MODEL_RUNNER_OUTPUT)
    assert sleeps == [0.005, 0.02]


def test_work_or_a_finished_transfer_never_waits(sleeps, monkeypatch):
    monkeypatch.delenv("NPU_KV_IDLE_POLL_MS", raising=False)
    done = copy(EMPTY_MODEL_RUNNER_OUTPUT)
    done.kv_connector_output = KVConnectorOutput(finished_recving={"req-1"})
    assert not kv_poll.pause_if_only_polling(step(3), EMPTY_MODEL_RUNNER_OUTPUT)
    assert not kv_poll.pause_if_only_polling(step(0), done)
    assert not kv_poll.pause_if_only_polling(None, EMPTY_MODEL_RUNNER_OUTPUT)
    monkeypatch.setattr(kv_poll, "has_kv_transfer_group", lambda: False)
    assert not kv_poll.pause_if_only_polling(step(0), EMPTY_MODEL_RUNNER_OUTPUT)
    assert sleeps == []


def test_zero_turns_the_pause_off_and_bad_values_are_named(sleeps, monkeypatch):
    monkeypatch.setenv("NPU_KV_IDLE_POLL_MS", "0")
    assert not kv_poll.pause_if_only_polling(step(0), EMPTY_MODEL_RUNNER_OUTPUT)
    assert sleeps == []
    monkeypatch.setenv("NPU_KV_IDLE_POLL_MS", "-1")
    with pytest.raises(ValueError, match=r"NPU_KV_IDLE_POLL_MS='-1' must be >= 0"):
        kv_poll.pause_if_only_polling(step(0), EMPTY_MODEL_RUNNER_OUTPUT)
