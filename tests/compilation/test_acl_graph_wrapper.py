"""ACLGraphWrapper dispatch: eager on mode mismatch, capture once per BatchDescriptor,
replay afterwards into the same output buffer, capture errors with an actionable hint."""
from __future__ import annotations

import pytest
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import BatchDescriptor, set_forward_context

from vllm_npu.compilation.acl_graph import ACLGraphWrapper, GraphCaptureError
from vllm_npu.ops.sim.checks import NPUOpError


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.lin(x))


def _run(wrapper, x, mode, desc):
    with set_forward_context(None, VllmConfig(), cudagraph_runtime_mode=mode,
                             batch_descriptor=desc):
        return wrapper(x)


@torch.inference_mode()
def test_capture_once_then_replay():
    torch.manual_seed(0)
    model, x = _Model(), torch.randn(8, 4)
    wrapper = ACLGraphWrapper(model, VllmConfig(), CUDAGraphMode.FULL)
    desc = BatchDescriptor(num_tokens=8, uniform=True)
    stats0 = (ACLGraphWrapper.stats.captures, ACLGraphWrapper.stats.replays)
    first = _run(wrapper, x, CUDAGraphMode.FULL, desc)
    x.copy_(torch.randn(8, 4))
    second = _run(wrapper, x, CUDAGraphMode.FULL, desc)
    assert second is first  # the captured output buffer is reused
    torch.testing.assert_close(second, model.forward(x))
    assert model.calls == 2  # capture + the reference call above: the replay ran no Python
    assert (ACLGraphWrapper.stats.captures - stats0[0],
            ACLGraphWrapper.stats.replays - stats0[1]) == (1, 1)
    assert wrapper.has_graph(desc) and not wrapper.has_graph(BatchDescriptor(num_tokens=4))


@torch.inference_mode()
def test_mode_mismatch_runs_eagerly():
    model, x = _Model(), torch.randn(2, 4)
    wrapper = ACLGraphWrapper(model, VllmConfig(), CUDAGraphMode.PIECEWISE)
    out = _run(wrapper, x, CUDAGraphMode.FULL, BatchDescriptor(num_tokens=2))
    torch.testing.assert_close(out, model.forward(x))
    assert not wrapper.entries
    assert wrapper(x).shape == (2, 4)  # no forward context at all: eager too


def test_capture_failure_names_the_batch_and_a_hint():
    def broken(x):
        raise RuntimeError("device out of memory")

    wrapper = ACLGraphWrapper(broken, VllmConfig(), CUDAGraphMode.FULL)
    with pytest.raises(GraphCaptureError) as e:
        _run(wrapper, torch.zeros(1), CUDAGraphMode.FULL, BatchDescriptor(num_tokens=16))
    msg = str(e.value)
    assert "FULL batch of 16 tokens" in msg and "device out of memory" in msg
    assert "--enforce-eager" in msg and "cudagraph_capture_sizes" in msg


def test_capture_out_of_memory_names_the_capture_sizes_to_drop():
    def hungry(x):
        raise torch.OutOfMemoryError("NPU out of memory. Tried to allocate 2.00 GiB")

    config = VllmConfig()
    config.compilation_config.cudagraph_capture_sizes = [1, 2, 4, 8, 16, 32]
    wrapper = ACLGraphWrapper(hungry, config, CUDAGraphMode.FULL)
    with pytest.raises(GraphCaptureError) as e:
        _run(wrapper, torch.zeros(1), CUDAGraphMode.FULL, BatchDescriptor(num_tokens=16))
    msg = str(e.value)
    assert "ran out of NPU memory; capture sizes [1, 2, 4, 8, 16, 32]: drop [16, 32]" in msg
    assert """'{"cudagraph_capture_sizes": [1, 2, 4, 8]}'""" in msg
    assert "--gpu-memory-utilization" in msg and "--enforce-eager" in msg


def test_needs_a_graph_mode():
    with pytest.raises(ValueError, match="FULL or PIECEWISE"):
        ACLGraphWrapper(_Model(), VllmConfig(), CUDAGraphMode.NONE)


@torch.inference_mode()
def test_every_replay_runs_the_task_refresh_first_and_waits_on_its_event():
    """The runner's refresh runs before each replay, whoever calls the model (vLLM's
    _dummy_run on an idle DP rank calls it directly), never at capture; the replay's
    captured wait needs the refresh to record the graph's event each time (a replay
    without a record since the captured reset would hang a device)."""
    model, x = _Model(), torch.randn(8, 4)
    wrapper = ACLGraphWrapper(model, VllmConfig(), CUDAGraphMode.FULL)
    desc = BatchDescriptor(num_tokens=8, uniform=True)
    seen = []

    def refresh(ctx, event):
        seen.append(ctx.batch_descriptor)
        event.record()

    wrapper.before_replay = refresh
    _run(wrapper, x, CUDAGraphMode.FULL, desc)  # capture: no refresh
    assert seen == []
    events = {id(e.event) for e in wrapper.entries.values()}
    _run(wrapper, x, CUDAGraphMode.FULL, desc)
    _run(wrapper, x, CUDAGraphMode.FULL, desc)  # the captured reset re-armed the wait
    assert seen == [desc, desc] and len(events) == 1
    wrapper.before_replay = lambda ctx, event: None  # updates, but never records
    with pytest.raises(NPUOpError, match="no task update recorded since its reset"):
        _run(wrapper, x, CUDAGraphMode.FULL, desc)
