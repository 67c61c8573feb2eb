"""The simulated graph runtime is as strict as ACL graphs: replay re-runs the captured
work on the captured buffers, and a task's host arguments stay frozen until updated."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import graph as g
from vllm_npu.ops.sim.checks import NPUOpError


@g.graph_op
def scale_into(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
    """A stand-in device op with a host-side argument (`factor`)."""
    out.copy_(x * factor)


@g.graph_op
def shift_into(x: torch.Tensor, by: float, out: torch.Tensor) -> None:
    out.copy_(x + by)


def _capture(fn):
    graph = g.SimGraph()
    graph.capture_begin()
    try:
        result = fn()
    finally:
        graph.capture_end()
    return graph, result


def test_replay_recomputes_from_the_captured_input_buffers():
    x = torch.ones(4)
    graph, y = _capture(lambda: torch.relu(x * 2) + 1)
    assert torch.equal(y, torch.full((4,), 3.0))
    x.copy_(torch.tensor([1.0, -1.0, 2.0, 0.0]))  # new batch written into the buffer
    graph.replay()
    assert torch.equal(y, torch.tensor([3.0, 1.0, 5.0, 1.0]))  # same output object
    assert graph.replays == 1


def test_task_arguments_stay_frozen_until_updated():
    x, out = torch.ones(3), torch.zeros(3)

    def forward():
        g.graph_task_group_begin()
        scale_into(x, 2.0, out)
        return g.graph_task_group_end()

    graph, handle = _capture(forward)
    assert torch.equal(out, torch.full((3,), 2.0))
    graph.replay()  # no update: the capture's host argument is replayed (stale)
    assert torch.equal(out, torch.full((3,), 2.0))
    g.graph_task_update_begin(None, handle)
    assert scale_into(x, 5.0, out) is None  # captured into the task, not executed
    g.graph_task_update_end(None)
    assert torch.equal(out, torch.full((3,), 2.0))
    graph.replay()
    assert torch.equal(out, torch.full((3,), 5.0)) and handle.updates == 1


def test_ops_outside_task_groups_are_frozen_entries():
    x, out = torch.ones(2), torch.zeros(2)
    graph, _ = _capture(lambda: scale_into(x, 3.0, out))
    x.fill_(2.0)
    graph.replay()
    assert torch.equal(out, torch.full((2,), 6.0))  # new data, frozen host argument


def test_update_must_reissue_the_same_op():
    x, out = torch.ones(2), torch.zeros(2)

    def forward():
        g.graph_task_group_begin()
        scale_into(x, 2.0, out)
        return g.graph_task_group_end()

    _, handle = _capture(forward)
    g.graph_task_update_begin(None, handle)
    shift_into(x, 1.0, out)
    with pytest.raises(NPUOpError, match=r"captured \['scale_into'\], got \['shift_into'\]"):
        g.graph_task_update_end(None)


def test_misuse_is_refused():
    with pytest.raises(RuntimeError, match="outside graph capture"):
        g.graph_task_group_begin()
    with pytest.raises(RuntimeError, match="without graph_task_update_begin"):
        g.graph_task_update_end()
    graph = g.SimGraph()
    graph.capture_begin()
    try:
        with pytest.raises(RuntimeError, match="already capturing"):
            g.SimGraph().capture_begin()
        with pytest.raises(RuntimeError, match="cannot replay while a graph is capturing"):
            graph.replay()
    finally:
        graph.capture_end()
    with pytest.raises(RuntimeError, match="never recorded"):
        g.ExternalEvent().wait()
