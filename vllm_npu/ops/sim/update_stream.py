"""What the simulated NPU lets a graph-update stream run.

A graph update is issued under `torch.npu.stream(update_stream)` around
`graph_task_update_begin/end`. Nothing orders that stream after the compute stream: the
work the compute stream queued this step (the runner's input copies, the attention
metadata builders) may not have run when the update stream runs its own. So a device op
issued there that reads batch data can read it before it is written, and a tensor it
allocates belongs to the update stream's allocations. vllm-ascend issues nothing on that
stream but the tasks' re-launches, with host-side lengths and with tensors its metadata
builders prepared on the compute stream (mla_v1.py `update_graph_params`,
attention_v1.py `update_attn_params`; torch_npu's test_aclgraph_update.py does the same).

The simulator refuses any other device op issued on a non-default graph stream: views,
shape queries and allocations pass, the op surface's re-issued calls are exempt (graph.py
`graph_op`), and host-side work is declared with `graph.host_work()` (on a device it runs
on CPU tensors, never on a stream). Every tensor is a CPU tensor here, so the declaration
is what tells host work from device work.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

from vllm_npu.ops.sim.checks import NPUOpError
from vllm_npu.ops.sim.streams import _FACTORIES, _VIEWS

# what reads no tensor data: shapes, addresses, allocations
_METADATA = {torch.Tensor.stride, torch.Tensor.storage_offset, torch.Tensor.data_ptr,
             torch.Tensor.is_contiguous, torch.Tensor.untyped_storage,
             torch.Tensor.element_size, torch.Tensor.new_empty, torch.Tensor.new_zeros}
_local = threading.local()


@contextlib.contextmanager
def exempt():
    """Work the simulator itself does for a call on the update stream (holding an op's
    arguments, preparing its launch), or declared host work."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


class UpdateStreamMode(TorchFunctionMode):
    """Active while a non-default graph stream is current (graph.py `use_stream`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (getattr(_local, "depth", 0) or func in _VIEWS or func in _FACTORIES
                or func in _METADATA or getattr(func, "__name__", "") == "__get__"):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        raise NPUOpError(
            f"simulated NPU: {name} issued on the graph-update stream: nothing orders that "
            "stream after the compute stream that wrote the batch's data this step. Build "
            "update arguments before the update (on the compute stream, as vllm-ascend's "
            "metadata builders do) and pass host lengths as host lists")
