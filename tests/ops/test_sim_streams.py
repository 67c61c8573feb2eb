"""The simulated NPU's streams and events: side-stream copies land only when waited for."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import streams
from vllm_npu.ops.sim.checks import NPUOpError
from vllm_npu.worker.accelerator import npu_runtime

INT32_MAX = torch.iinfo(torch.int32).max


def test_side_stream_copy_is_poison_until_the_event_is_synchronized():
    side, ready = streams.Stream(), streams.Event(blocking=True)
    device = torch.arange(6, dtype=torch.int32)
    with streams.stream(side):
        side.wait_stream(streams.current_stream())
        host = device.to("cpu", non_blocking=True)
        ready.record()
    assert host is not device and host.shape == device.shape
    assert (host == INT32_MAX).all() and not ready.query()
    ready.synchronize()
    assert ready.query() and host.tolist() == list(range(6))


def test_queued_copy_reads_its_source_when_it_runs():
    """A source overwritten before the wait is what the copy sees (latest possible run)."""
    side, ready = streams.Stream(), streams.Event()
    src, dst = torch.zeros(3), torch.empty(3)
    with streams.stream(side):
        dst.copy_(src, non_blocking=True)
        ready.record()
    assert torch.isnan(dst).all()
    src.fill_(7.0)
    ready.synchronize()
    assert dst.tolist() == [7.0, 7.0, 7.0]


def test_fills_and_setitem_are_deferred_and_events_order_work():
    side = streams.Stream()
    buf = torch.ones(4, dtype=torch.int64)
    with streams.stream(side):
        buf[:2] = 0
        first = streams.Event()
        first.record()
        buf.zero_()
    assert buf.tolist() == [1, 1, 1, 1]
    first.synchronize()  # runs the work up to the event, not beyond
    assert buf.tolist() == [0, 0, 1, 1]
    side.synchronize()
    assert buf.tolist() == [0, 0, 0, 0]


def test_default_stream_waiting_runs_the_side_work():
    side = streams.Stream()
    dst = torch.empty(2, dtype=torch.int32)
    with streams.stream(side):
        dst.copy_(torch.tensor([3, 4], dtype=torch.int32), non_blocking=True)
    streams.current_stream().wait_stream(side)
    assert dst.tolist() == [3, 4]


def test_compute_on_a_side_stream_is_refused():
    with streams.stream(streams.Stream()):
        with pytest.raises(NPUOpError, match="side stream"):
            torch.ones(3).add(1)


def test_interprocess_events_are_refused():
    with pytest.raises(NPUOpError, match="interprocess"):
        streams.Event(interprocess=True)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a CPU-only torch")
def test_runtime_scope_swaps_cuda_names_and_device_synchronize_flushes():
    cuda_stream, event = torch.cuda.Stream, torch.Event
    with npu_runtime():
        assert torch.cuda.Stream is streams.Stream and torch.Event is streams.Event
        side = torch.cuda.Stream()
        dst = torch.empty(2)
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() is side
            dst.copy_(torch.tensor([1.0, 2.0]), non_blocking=True)
        assert torch.isnan(dst).all()
        torch.accelerator.synchronize()
        assert dst.tolist() == [1.0, 2.0]
    assert torch.cuda.Stream is cuda_stream and torch.Event is event
