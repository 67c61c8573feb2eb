"""ModelSlim W8A8_DYNAMIC MoE experts on the NPU: int8 expert weights, per-channel scales,
activations quantised per token inside the expert MLP (moe/experts.py `Int8Experts`).

Checkpoint, per expert e (ModelSlim's names; vLLM's expert mapping loads them into
`experts.w13_*` / `experts.w2_*`): `gate_proj` / `up_proj` / `down_proj` `.weight` int8
[out, in], `.weight_scale` and `.weight_offset` [out, 1] (symmetric: offsets zero). The
parameters are indexed by local slot like the float method's, so routing, expert
parallelism and the EPLB runtime (which moves `slot_tensors`: weights and scales) are the
same code. The device form is vllm-ascend's quantised MoE MLP (`npu_dynamic_quant` +
per-token `npu_grouped_matmul`, as in vllm_ascend/ops/fused_moe/moe_mlp.py).
"""
from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe.config import int8_w8a8_moe_quant_config
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.utils import set_weight_attrs

from vllm_npu.moe.experts import Experts, Int8Experts
from vllm_npu.layers.fused_moe import NPUMoEMethodMixin

SCHEME = "W8A8_DYNAMIC"


def _gmm_scale_dtype(act_dtype: torch.dtype) -> torch.dtype:
    """npu_grouped_matmul's per-token int8 form pairs a bfloat16 scale with bfloat16 output
    and a float32 scale with float16 output (op-plugin's npu_grouped_matmul doc, per-token
    table); vllm-ascend casts the scale to bfloat16 for bf16 models. float32 output (the
    simulator's parity extension) keeps float32."""
    return torch.bfloat16 if act_dtype == torch.bfloat16 else torch.float32


class NPUW8A8DynamicFusedMoEMethod(NPUMoEMethodMixin, FusedMoEMethodBase):
    ACTIVATIONS = ("silu",)  # Int8Experts: npu_swiglu between the quantised matmuls
    TAKES_BIAS = False

    def __init__(self, moe, layer_name: str) -> None:
        super().__init__(moe)
        self.layer_name = layer_name

    def create_weights(self, layer, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        local = self._prepare(layer, extra_weight_attrs)
        inter = intermediate_size_per_partition
        self._scale_dtype = _gmm_scale_dtype(params_dtype)

        def add(name: str, *shape: int, dtype: torch.dtype, fill: float = 0.0) -> None:
            param = torch.nn.Parameter(torch.full((local, *shape), fill, dtype=dtype),
                                       requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, extra_weight_attrs)

        add("w13_weight", 2 * inter, hidden_size, dtype=torch.int8)
        add("w2_weight", hidden_size, inter, dtype=torch.int8)
        for prefix, rows in (("w13", 2 * inter), ("w2", hidden_size)):
            add(f"{prefix}_weight_scale", rows, 1, dtype=torch.float32, fill=float("nan"))
            add(f"{prefix}_weight_offset", rows, 1, dtype=torch.float32)
        self._finish(layer)

    def process_weights_after_loading(self, layer) -> None:
        for prefix in ("w13", "w2"):
            scale = getattr(layer, f"{prefix}_weight_scale").data
            missing = torch.isnan(scale).reshape(scale.shape[0], -1).any(dim=1)
            if missing.any():
                slots = missing.nonzero().flatten().tolist()
                raise ValueError(
                    f"{SCHEME} MoE layer {self.layer_name}: {prefix} weight_scale missing "
                    f"from the checkpoint for experts "
                    f"{sorted({self._local[s] for s in slots})}")
            if getattr(layer, f"{prefix}_weight_offset").data.abs().max() > 0:
                raise ValueError(f"{SCHEME} MoE layer {self.layer_name}: a non-zero "
                                 f"{prefix} weight_offset (asymmetric weights) is not "
                                 "supported")
            # [S, rows, 1] -> [S, rows]: the grouped matmul's per-channel scale
            scale = scale.squeeze(-1).to(self._scale_dtype).contiguous()
            setattr(layer, f"{prefix}_weight_scale",
                    torch.nn.Parameter(scale, requires_grad=False))

    def slot_tensors(self, layer) -> tuple[torch.Tensor, ...]:
        return (layer.w13_weight, layer.w2_weight, layer.w13_weight_scale,
                layer.w2_weight_scale)

    def experts(self, layer) -> Experts:
        return Int8Experts(layer.w13_weight, layer.w2_weight, layer.w13_weight_scale,
                           layer.w2_weight_scale)

    def get_fused_moe_quant_config(self, layer):
        return int8_w8a8_moe_quant_config(
            w1_scale=layer.w13_weight_scale, w2_scale=layer.w2_weight_scale,
            a1_scale=None, a2_scale=None, per_act_token_quant=True)
