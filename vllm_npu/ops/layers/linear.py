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

from vllm_npu.ops.sim import linear as sim_linear


def _device_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    return sim_linear.linear(x, weight, bias)


class _DeviceMatmul:
    """Mixed in front of a vLLM linear class: its unquantized method's gemm becomes the
    simulated device's matmul once the layer is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if type(self.quant_method) is UnquantizedLinearMethod:
            self.quant_method._gemm_impl = _device_gemm


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
