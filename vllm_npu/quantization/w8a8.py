"""Int8 linear methods on the NPU op surface: ModelSlim's W8A8 (static) and W8A8_DYNAMIC.

Per quantised Linear (n outputs, k inputs; shards of fused layers load into their rows):

    W8A8          weight int8 [n, k]; input_scale / input_offset per tensor (one per
                  shard of a fused layer: they see the same input, so they must agree);
                  weight_scale / weight_offset [n, 1] (written by ModelSlim, unused);
                  deq_scale [n] (float32, or int64 holding float32 bits for fp16 models);
                  quant_bias int32 [n] = round(bias / deq_scale - rowsum(W) * input_offset)
        x_q = npu_quantize(x, 1 / input_scale, input_offset, div_mode=False)
                                                              round(x * (1/s) + o), int8
        y   = npu_quant_matmul(x_q, W^T, deq_scale, bias=quant_bias)   (acc + qb) * deq
    W8A8_DYNAMIC  weight int8 [n, k]; weight_scale [n, 1] (weight_offset zeros)
        x_q, t = npu_dynamic_quant(x)                         per-token symmetric
        y   = npu_quant_matmul(x_q, W^T, weight_scale, pertoken_scale=t, bias=bias)

Formats from ModelSlim's savers and vllm-ascend's methods (see the facts note
docs/quantization.md): the float `bias` of a static layer is already folded
into quant_bias and is not added again; a row-parallel layer adds quant_bias on TP rank 0
only (the partial sums are all-reduced). Weights are stored transposed, [k, n], as
npu_quant_matmul takes x2.
"""
from __future__ import annotations

import torch
from vllm.distributed import get_tensor_model_parallel_rank
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    RowParallelLinear,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

from vllm_npu import ops


def _float_bits(scale: torch.Tensor) -> torch.Tensor:
    """float32 values -> int64 holding their bits in the low word (ModelSlim, fp16 models)."""
    return scale.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_float(scale: torch.Tensor) -> torch.Tensor:
    return (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


def _deq_scale_loader(loader, as_bits: bool):
    """deq_scale comes as float32 (bf16 models) or int64 bit patterns (fp16 models); the
    parameter holds what npu_quant_matmul takes for this model's output dtype."""

    def load(param, loaded_weight, *args, **kwargs):
        if loaded_weight.dtype == torch.int64 and not as_bits:
            loaded_weight = _bits_float(loaded_weight)
        elif loaded_weight.dtype != torch.int64 and as_bits:
            loaded_weight = _float_bits(loaded_weight)
        return loader(param, loaded_weight, *args, **kwargs)

    return load


class _Int8LinearMethod(LinearMethodBase):
    scheme = ""

    def __init__(self, layer_name: str) -> None:
        self.layer_name = layer_name

    def checked(self, loader, name: str):
        """The layer's loader, with a message naming the tensor when it does not fit."""

        def load(param, loaded_weight, *args, **kwargs):
            try:
                return loader(param, loaded_weight, *args, **kwargs)
            except (AssertionError, RuntimeError, IndexError) as e:
                raise ValueError(
                    f"{self.scheme} layer {self.layer_name}: {name} of shape "
                    f"{tuple(loaded_weight.shape)} ({loaded_weight.dtype}) does not fit the "
                    f"layer's {tuple(param.shape)} ({param.dtype}); shard "
                    f"{args[0] if args else kwargs.get('shard_id')}: {e or type(e).__name__}"
                ) from e

        return load

    def _weight(self, layer, output_partition_sizes, input_size_per_partition, loader):
        weight = ModelWeightParameter(
            data=torch.zeros(sum(output_partition_sizes), input_size_per_partition,
                             dtype=torch.int8),
            input_dim=1, output_dim=0, weight_loader=self.checked(loader, "weight"))
        layer.register_parameter("weight", weight)

    def _channel(self, layer, name, rows, dtype, loader, trailing=()):
        layer.register_parameter(name, ChannelQuantScaleParameter(
            data=torch.zeros(rows, *trailing, dtype=dtype), output_dim=0,
            weight_loader=self.checked(loader, name)))

    def _finish_weight(self, layer) -> None:
        w = layer.weight.data
        if w.dtype != torch.int8:
            raise ValueError(f"{self.scheme} layer {self.layer_name}: weight has dtype "
                             f"{w.dtype}; the checkpoint must hold int8 weights")
        layer.weight = torch.nn.Parameter(w.t().contiguous(), requires_grad=False)  # [k, n]


@register_weight_loader_v2_supported_method  # vLLM's parameter classes load the shards
class W8A8LinearMethod(_Int8LinearMethod):
    """Static per-tensor activation, per-channel weight (ModelSlim W8A8)."""
    scheme = "W8A8"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       input_size, output_size, params_dtype, **extra):
        loader = extra["weight_loader"]
        rows = sum(output_partition_sizes)
        self._weight(layer, output_partition_sizes, input_size_per_partition, loader)
        shards = len(output_partition_sizes)
        for name in ("input_scale", "input_offset"):
            layer.register_parameter(name, PerTensorScaleParameter(
                data=torch.full((shards,), float("nan")),
                weight_loader=self.checked(loader, name)))
        # int64 bit patterns for float16 output (npu_quant_matmul), float32 otherwise
        as_bits = params_dtype == torch.float16
        self._channel(layer, "deq_scale", rows, torch.int64 if as_bits else torch.float32,
                      _deq_scale_loader(loader, as_bits))  # checked inside _channel
        self._channel(layer, "quant_bias", rows, torch.int32, loader)
        # ModelSlim writes the weights' own per-channel scale / offset for static layers
        # too (vllm-ascend's W8A8 static method declares them); deq_scale already holds
        # input_scale * weight_scale, so they are loaded and not used.
        for name in ("weight_scale", "weight_offset"):
            self._channel(layer, name, rows, torch.float32, loader, trailing=(1,))

    def process_weights_after_loading(self, layer) -> None:
        self._finish_weight(layer)
        scale, offset = layer.input_scale.data, layer.input_offset.data
        if torch.isnan(scale).any() or torch.isnan(offset).any():
            raise ValueError(f"W8A8 layer {self.layer_name}: input_scale/input_offset "
                             "missing from the checkpoint")
        if (scale != scale[0]).any() or (offset != offset[0]).any():
            raise ValueError(f"W8A8 layer {self.layer_name}: the fused shards' input_scale "
                             f"{scale.tolist()} / input_offset {offset.tolist()} differ; "
                             "they quantise one input and must agree")
        k, dtype = layer.weight.shape[0], layer.params_dtype
        # npu_quantize's multiply form (div_mode=False: aclnnAscendQuantV3) with the
        # reciprocal scale and the offset in the activations' dtype, as vllm-ascend's
        # quant_per_tensor; the divide form takes no float16 input (ops/sim/quant.py).
        layer.aclnn_input_scale_reciprocal = (1.0 / scale[:1].double()).to(dtype).repeat(k)
        layer.aclnn_input_offset = offset[:1].round().to(dtype).repeat(k)
        deq = layer.deq_scale.data
        values = _bits_float(deq) if deq.dtype == torch.int64 else deq
        if not (values > 0).all():
            raise ValueError(f"W8A8 layer {self.layer_name}: deq_scale missing from the "
                             "checkpoint or not positive")
        # Row-parallel: the partial sums are all-reduced, the bias correction counts once.
        layer.add_quant_bias = not isinstance(layer, RowParallelLinear) or \
            get_tensor_model_parallel_rank() == 0

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x_q = ops.npu_quantize(x2, layer.aclnn_input_scale_reciprocal,
                               layer.aclnn_input_offset, torch.qint8, -1, False)
        y = ops.npu_quant_matmul(x_q, layer.weight, layer.deq_scale,
                                 bias=layer.quant_bias if layer.add_quant_bias else None,
                                 output_dtype=x.dtype)
        return y.reshape(*shape[:-1], y.shape[-1])


@register_weight_loader_v2_supported_method
class W8A8DynamicLinearMethod(_Int8LinearMethod):
    """Dynamic per-token activation, per-channel weight (ModelSlim W8A8_DYNAMIC)."""
    scheme = "W8A8_DYNAMIC"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       input_size, output_size, params_dtype, **extra):
        loader = extra["weight_loader"]
        rows = sum(output_partition_sizes)
        self._weight(layer, output_partition_sizes, input_size_per_partition, loader)
        self._channel(layer, "weight_scale", rows, torch.float32, loader, trailing=(1,))
        self._channel(layer, "weight_offset", rows, torch.float32, loader, trailing=(1,))
        layer.weight_scale.data.fill_(float("nan"))

    def process_weights_after_loading(self, layer) -> None:
        self._finish_weight(layer)
        scale = layer.weight_scale.data.reshape(-1).float()
        if torch.isnan(scale).any():
            raise ValueError(f"W8A8_DYNAMIC layer {self.layer_name}: weight_scale missing "
                             "from the checkpoint")
        if layer.weight_offset.data.abs().max() > 0:
            raise ValueError(f"W8A8_DYNAMIC layer {self.layer_name}: a non-zero weight_offset "
                             "(asymmetric weights) is not supported")
        layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x_q, token_scale = ops.npu_dynamic_quant(x.reshape(-1, shape[-1]))
        y = ops.npu_quant_matmul(x_q, layer.weight, layer.weight_scale,
                                 pertoken_scale=token_scale, bias=bias, output_dtype=x.dtype)
        return y.reshape(*shape[:-1], y.shape[-1])
