"""vLLM's unquantized linear layers computing with the simulated device's matmul.

Registered only on the simulated NPU (`registration.py`): on a real NPU vLLM's own
layers run `F.linear`, which torch_npu computes on the device. vLLM picks the gemm of
`UnquantizedLinearMethod` by platform (`dispatch_unquantized_gemm`: CUDA, ROCm, CPU, else
`F.linear`), with no hook for another platform; its pluggable-layer registry
(`PluggableLayer.register_oot`) is the supported way to replace the layers, and LoRA finds
the replacements (`maybe_get_oot_by_class`). Each class below is vLLM's, with its
unquantized method's gemm pointed at `ops.sim.linear.linear`; quantized layers are left
as their quantization method made them.
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
