"""vLLM's unquantized linear layers computing with the simulated device's matmul.

Registered only on the simulated NPU (`registration.py`): on a real NPU vLLM's own
layers run `F.linear`, which torch_npu computes on the device. vLLM picks the gemm of
`UnquantizedLinearMethod` by platform (`dispatch_unquantized_gemm`: CUDA, ROCm, CPU, else
`F.linear`), with no hook for another platform; its pluggable-layer registry
(`PluggableLayer.register_oot`) is the supported way to replace the layers, and LoRA finds
the replacements (`maybe_get_oot_by_class`). Each class below is vLLM's, with its
unquantized method's gemm pointed at `ops.sim.linear.linear`; quantized layers are left
as their quantization method made them.

The logits projection too (an LM head, or the input embedding it is tied to): vLLM
computes it outside the model's forward, on the host's one torch thread, where a device
runs it on all its cores like any other matmul; `sim_linear.device_linear` gives it the
simulated device's cores (128 x 128 -> 408 float32: 155 us on one thread, 88 us on two).
vLLM's embedding method has no gemm hook, so the layer's method is the subclass below.
"""
from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)

from vllm_npu.ops import sim as sim_ops
from vllm_npu.ops.sim import linear as sim_linear


def _device_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    return sim_ops.device_matmul(x, weight, bias)  # an opaque op for Dynamo (sim/opaque.py)


def device_weight_layout(layer: torch.nn.Module) -> None:
    """The layer's float32 weight [N, K] kept K-major (`weight.t()` contiguous, the same
    tensor shape): the simulated device's weight format. A device keeps its linear weights
    in the layout its matmul reads fastest, converted once after loading (vllm-ascend casts
    them to FRACTAL_NZ, `torch_npu.npu_format_cast(weight, 29)`, in
    process_weights_after_loading; vLLM's own XPU path re-lays weights the same way,
    `weight.t().contiguous().t()`); the simulator's decode matmul then multiplies rows of
    w^T (csrc/sim_gemm.c: 16-27% faster than the dot products on [N, K] at 128 rows),
    oneDNN's prefill matmul takes either layout (bitwise equal). Weights whose N is not
    whole vectors of 16 stay as they are; a reload copies into the same layout."""
    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 \
            and weight.dtype == torch.float32 and weight.shape[0] % 16 == 0 \
            and weight.shape[1] > 1 and weight.is_contiguous():
        weight.data = weight.data.t().contiguous().t()


class _DeviceMatmul:
    """Mixed in front of a vLLM linear class: its unquantized method's gemm becomes the
    simulated device's matmul once the layer is built, and its weights take the device's
    layout once loaded (`device_weight_layout`; the method object stays vLLM's own class:
    vLLM picks weight loaders by its class name)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        method = self.quant_method
        if type(method) is UnquantizedLinearMethod:
            method._gemm_impl = _device_gemm
            after_loading = method.process_weights_after_loading

            def process_weights_after_loading(layer: torch.nn.Module) -> None:
                after_loading(layer)
                device_weight_layout(layer)

            method.process_weights_after_loading = process_weights_after_loading


@ReplicatedLinear.register_oot
class NPUReplicatedLinear(_DeviceMatmul, ReplicatedLinear):
    pass


@ColumnParallelLinear.register_oot
class NPUColumnParallelLinear(_DeviceMatmul, ColumnParallelLinear):
    pass


@MergedColumnParallelLinear.register_oot
class NPUMergedColumnParallelLinear(_DeviceMatmul, MergedColumnParallelLinear):
    pass


@QKVParallelLinear.register_oot
class NPUQKVParallelLinear(_DeviceMatmul, QKVParallelLinear):
    pass


@RowParallelLinear.register_oot
class NPURowParallelLinear(_DeviceMatmul, RowParallelLinear):
    pass


class _DeviceEmbeddingMethod(UnquantizedEmbeddingMethod):
    """vLLM's unquantized embedding method; its `apply` (logits = hidden . weight^T) on the
    simulated device's cores."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return sim_linear.device_linear(x, layer.weight, bias)


class _DeviceHead:
    """Mixed in front of vLLM's embedding classes: an unquantized layer's logits
    projection becomes the simulated device's matmul once the layer is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if type(self.quant_method) is UnquantizedEmbeddingMethod:
            self.quant_method = _DeviceEmbeddingMethod()


@VocabParallelEmbedding.register_oot
class NPUVocabParallelEmbedding(_DeviceHead, VocabParallelEmbedding):
    pass


@ParallelLMHead.register_oot
class NPUParallelLMHead(_DeviceHead, ParallelLMHead):
    pass
