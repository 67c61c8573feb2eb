"""VllmEplbAdaptor: what the EPLB runtime sees of a loaded vLLM model on the NPU.

    model ──> MoE layers (RoutedExperts whose method is the NPU fused-MoE method), by
              decoder layer id, each with
                weights    w13 [S, 2I, H], w2 [S, H, I]   this rank's S physical slots
                           (int8 experts: also their per-channel scales [S, 2I], [S, H])
                placement  phy2log over all EP ranks (ExpertPlacement)
                load       int64 [ep*S] pairs routed to each physical slot (device counter)

Load is counted on the device inside the MoE forward (one index_add per layer and step,
captured into decode graphs like the rest of the layer), so reading it is the only host
sync, once per window. A rank counts the pairs of its own tokens before they are
dispatched; TP ranks of one DP rank count the same tokens, so a global window is the sum
over the DP group.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class MoELayerView:
    layer_id: int
    layer: torch.nn.Module  # vLLM's RoutedExperts
    method: torch.nn.Module  # an NPU fused-MoE method (NPUMoEMethodMixin)

    @property
    def weights(self) -> tuple[torch.Tensor, ...]:
        """Every tensor indexed by slot: what moves with an expert."""
        return self.method.slot_tensors(self.layer)

    @property
    def placement(self):
        return self.method.placement

    @property
    def load(self) -> torch.Tensor:
        return self.method.expert_load


def moe_layers(model: torch.nn.Module) -> list[MoELayerView]:
    """The model's MoE layers on the NPU fused-MoE method, by decoder layer id."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    from vllm_npu.layers.fused_moe import NPUMoEMethodMixin

    views = [MoELayerView(m.quant_method.layer_id, m, m.quant_method)
             for m in model.modules()
             if isinstance(m, RoutedExperts)
             and isinstance(m.quant_method, NPUMoEMethodMixin)]
    return sorted(views, key=lambda v: v.layer_id)


class VllmEplbAdaptor:
    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = moe_layers(model)
        if not self.layers:
            raise ValueError("the model has no MoE layers on the NPU fused-MoE method")

    @property
    def layer_ids(self) -> list[int]:
        return [v.layer_id for v in self.layers]

    def physical_load(self) -> torch.Tensor:
        """[L, ep*S] int64 on the device (no host sync)."""
        return torch.stack([v.load for v in self.layers])

    def logical_load(self) -> np.ndarray:
        """[L, E] int64 on the host: each slot's count added to the expert it holds."""
        physical = self.physical_load().cpu().numpy()
        out = np.zeros((len(self.layers), self.layers[0].placement.num_experts), np.int64)
        for i, view in enumerate(self.layers):
            np.add.at(out[i], np.asarray(view.placement.phy2log), physical[i])
        return out

    def reset_load(self) -> None:
        for view in self.layers:
            view.load.zero_()
