"""compressed-tensors int8 W8A8 (vLLM's standard format) on the NPU op surface.

vLLM's `CompressedTensorsW8A8Int8` scheme loads the checkpoint (int8 `weight` [n, k],
`weight_scale` per channel or per tensor, static `input_scale`) and picks a kernel from
its int8 kernel table, which has no out-of-tree entry; this kernel is registered there
for the OOT platform (`register_linear_kernel(..., "int8")`), so vLLM's own scheme, weight
loading and fused-shard handling stay as they are:

    dynamic  x_q, t = npu_dynamic_quant(x)                       per token, symmetric
    static   x_q = npu_quantize(x, 1 / input_scale, div_mode=False), t = input_scale
             per token
             y = npu_quant_matmul(x_q, W^T, weight_scale, pertoken_scale=t, bias=bias)

(the static scale rides as a per-token scale: it lets a float bias be added after
dequantisation for every output dtype the op takes). Asymmetric activations (zero
points) are not supported: the kernel declines them with a reason vLLM reports.
"""
from __future__ import annotations

import torch
from vllm.model_executor.kernels.linear import register_linear_kernel
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    Int8ScaledMMLinearKernel,
    Int8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils import replace_parameter
from vllm.model_executor.layers.quantization.utils.w8a8_utils import convert_to_channelwise
from vllm.platforms import PlatformEnum

from vllm_npu import ops


class NPUInt8ScaledMMLinearKernel(Int8ScaledMMLinearKernel):
    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        from vllm.platforms import current_platform

        if not current_platform.is_out_of_tree():
            return False, "requires the NPU platform"
        return True, None

    @classmethod
    def can_implement(cls, c: Int8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        if not c.input_symmetric:
            return False, ("asymmetric int8 activations (input zero points) are not "
                           "supported on the NPU platform")
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        w_name, ws_name, is_name, zp_name, azp_name = self.layer_param_names
        weight = getattr(layer, w_name)
        n, k = weight.shape  # [out, in] as loaded; the transposed copy is what stays
        replace_parameter(layer, w_name, torch.nn.Parameter(weight.data.t().contiguous(),
                                                            requires_grad=False))
        scale = getattr(layer, ws_name)
        if len(layer.logical_widths) > 1 and not self.config.is_channelwise:
            scale = convert_to_channelwise(scale, layer.logical_widths)
        scale = scale.data.reshape(-1).float()
        if scale.numel() == 1:
            scale = scale.expand(n).contiguous()
        replace_parameter(layer, ws_name, torch.nn.Parameter(scale, requires_grad=False))
        if self.config.is_static_input_scheme:
            # the fused shards quantise one input: one scale (vLLM's kernels take the max)
            input_scale = getattr(layer, is_name).data.max().float().reshape(1)
            replace_parameter(layer, is_name, torch.nn.Parameter(input_scale,
                                                                 requires_grad=False))
            # the multiply form of npu_quantize, scales in the activations' dtype (see
            # quantization/w8a8.py)
            layer.npu_input_scale_reciprocal = (1.0 / input_scale.double()).to(
                layer.params_dtype).expand(k).contiguous()
        setattr(layer, zp_name, None)
        setattr(layer, azp_name, None)

    def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        w, ws, input_scale, _, _ = self._get_layer_params(layer)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.config.is_static_input_scheme:
            x_q = ops.npu_quantize(x2, layer.npu_input_scale_reciprocal, None,
                                   torch.qint8, -1, False)
            token_scale = input_scale.expand(x2.shape[0]).contiguous()
        else:
            x_q, token_scale = ops.npu_dynamic_quant(x2)
        y = ops.npu_quant_matmul(x_q, w, ws, pertoken_scale=token_scale, bias=bias,
                                 output_dtype=x.dtype)
        return y.reshape(*shape[:-1], y.shape[-1])

    def _get_layer_params(self, layer):
        w_name, ws_name, is_name, zp_name, azp_name = self.layer_param_names
        return (getattr(layer, w_name), getattr(layer, ws_name),
                getattr(layer, is_name, None), None, None)


register_linear_kernel(NPUInt8ScaledMMLinearKernel, PlatformEnum.OOT, "int8")
