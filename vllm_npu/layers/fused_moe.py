"""The unquantized fused-MoE method on the NPU (vLLM's `UnquantizedMoeBackend.OOT`).

vLLM 0.33 leaves the whole MoE computation of an out-of-tree platform to the plugin
(`UnquantizedFusedMoEMethod.process_weights_after_loading`: "OOT handles internally").
This method is monolithic: vLLM's runner hands it router logits, it routes
(`npu_moe_gating_top_k`), maps logical experts to physical slots (replicas allowed),
moves tokens between expert-parallel ranks and runs its own slots' grouped matmuls.
Shared experts, the routed scaling vLLM applies to the output, and the final TP
all-reduce stay with vLLM's runner. No host sync on the all-gather path, so decode
graphs capture it. The int8 method (quantization/w8a8_moe.py) shares all of it but
its weights.
"""
from __future__ import annotations


import torch
from vllm.distributed import get_tp_group
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from vllm_npu.config import get_npu_config
from vllm_npu.moe import dispatch, expert_map
from vllm_npu.moe.experts import Experts, FloatExperts, run_local_experts
from vllm_npu.moe.routing import routing_problems, select_experts


def _layer_id(layer_name: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index

    return extract_layer_index(layer_name)


class NPUMoEMethodMixin:
    """What every NPU fused-MoE method shares: the placement of logical experts on
    physical slots, the expert-parallel layout, the checkpoint loader that fills every slot
    holding an expert, and the monolithic forward. A method supplies its weights
    (`create_weights` between `_prepare` and `_finish`) and `experts(layer)`."""

    # gated activations: 'silu' (npu_swiglu), 'swigluoai' (gpt-oss, npu_clipped_swiglu)
    ACTIVATIONS = ("silu", "swigluoai")
    TAKES_BIAS = True  # expert biases ride on npu_grouped_matmul's `bias`

    @property
    def is_monolithic(self) -> bool:
        return True

    @property
    def supports_internal_mk(self) -> bool:
        # This method moves tokens between DP ranks itself: vLLM's naive dispatch is off.
        return True

    @property
    def supports_eplb(self) -> bool:
        return False  # the NPU EPLB runtime changes the placement (expert_map.py) instead

    # ---- weights ---------------------------------------------------------------------
    def _prepare(self, layer, extra_weight_attrs: dict) -> int:
        """Placement and layout; returns the number of local slots to allocate."""
        self._check_supported(layer)
        parallel = self.moe.moe_parallel_config
        ep_size = parallel.ep_size if parallel.use_ep else 1
        logical = self.moe.num_logical_experts
        config = get_npu_config()
        self.options = config.moe  # forward runs without a current config
        self.layer_id = _layer_id(layer.layer_name)
        self.placement = _initial_placement(config, self.layer_id, logical, ep_size)
        # The attention TP group (with EP, vLLM's MoE config reports tp_size 1).
        tp = get_tp_group()
        self.layout = dispatch.EPLayout(
            ep_rank=parallel.ep_rank if parallel.use_ep else 0, ep_size=ep_size,
            tp_rank=tp.rank_in_group, tp_size=tp.world_size, dp_size=parallel.dp_size,
            slots_per_rank=self.placement.slots_per_rank)
        self._local = self.placement.local_experts(self.layout.ep_rank)
        extra_weight_attrs["weight_loader"] = self._weight_loader(layer)
        return len(self._local)

    def _finish(self, layer) -> None:
        log2phy, replicas = self.placement.tables(self.placement.max_replicas)
        device = layer.w13_weight.device
        self.log2phy, self.replicas = log2phy.to(device), replicas.to(device)
        # Pairs this rank's tokens routed to each physical slot, since the last reset
        # (EPLB's load window; read by vllm_npu.eplb.runtime.adaptor). Counted on the device.
        self.expert_load = torch.zeros(self.placement.num_physical, dtype=torch.int64,
                                       device=device)

    def slot_tensors(self, layer) -> tuple[torch.Tensor, ...]:
        """Every tensor indexed by local slot (what EPLB moves with an expert)."""
        biases = (layer.w13_bias, layer.w2_bias) if self.moe.has_bias else ()
        return (layer.w13_weight, layer.w2_weight, *biases)

    def experts(self, layer) -> Experts:
        bias = self.moe.has_bias
        return FloatExperts(layer.w13_weight, layer.w2_weight,
                            w13_bias=layer.w13_bias if bias else None,
                            w2_bias=layer.w2_bias if bias else None,
                            clipped=self.moe.activation.value == "swigluoai")

    def set_placement(self, placement: expert_map.ExpertPlacement) -> None:
        """Route by a new placement (the EPLB runtime moved the weights first). The
        tables change in place: captured graphs keep reading the same tensors."""
        log2phy, replicas = placement.tables(self.placement.max_replicas)
        self.log2phy.copy_(log2phy)
        self.replicas.copy_(replicas)
        self.placement = placement
        self._local = placement.local_experts(self.layout.ep_rank)

    def _check_supported(self, layer) -> None:
        problems = routing_problems(layer, self.moe.num_logical_experts)
        activation = self.moe.activation.value
        if not self.moe.is_act_and_mul or activation not in self.ACTIVATIONS:
            problems.append(f"activation {activation!r} (the NPU MoE path runs gated experts "
                            f"with {self.ACTIVATIONS})")
        if self.moe.has_bias and not self.TAKES_BIAS:
            problems.append("expert biases")
        if problems:
            raise ValueError(f"MoE layer {layer.layer_name} cannot run on the NPU: "
                             f"{'; '.join(problems)}")

    def _weight_loader(self, layer):
        """Load checkpoint expert `expert_id` into every local slot that holds it. Per-
        channel scales / offsets load like their weights' rows, except w2's: its output
        channels (hidden) are not split by TP, so each rank takes them whole."""
        stacks_loaded: set[tuple] = set()

        def load(param, loaded_weight, weight_name, shard_id, expert_id,
                 return_success=False):
            if loaded_weight.dim() == 3 and shard_id in ("w1", "w2", "w3"):
                # Experts stacked [E, out, in] (Llama 4's fused checkpoint tensors), handed
                # over once per expert id: each local slot takes its own expert's rows
                key = (id(param), shard_id, loaded_weight.data_ptr())
                if key not in stacks_loaded:
                    stacks_loaded.add(key)
                    stacked = _stacked_experts(layer, self.moe.num_logical_experts,
                                               loaded_weight.shape[0])
                    missing = sorted(set(self._local) - set(stacked))
                    if missing:
                        raise ValueError(
                            f"{layer.layer_name}: experts {missing} are placed on this rank "
                            "but the model's loader hands it only experts "
                            f"{stacked} (a stacked checkpoint under EP follows vLLM's "
                            "linear split: drop moe.expert_map_path / redundant experts)")
                    for row, e in enumerate(stacked):
                        load(param, loaded_weight[row], weight_name, shard_id, e)
                return True if return_success else None
            slots = [s for s, e in enumerate(self._local) if e == expert_id]
            if loaded_weight.dim() != 2 or shard_id not in ("w1", "w2", "w3"):
                raise ValueError(f"{layer.layer_name}: unexpected expert weight "
                                 f"{weight_name} {tuple(loaded_weight.shape)} ({shard_id})")
            if param.dtype == torch.int8 and loaded_weight.dtype != torch.int8:
                raise ValueError(f"{weight_name} of expert {expert_id} ({shard_id}) is "
                                 f"{loaded_weight.dtype}; the quantised experts need int8 "
                                 "weights")
            channel = weight_name.endswith(("weight_scale", "weight_offset"))
            tp_rank = layer.moe_config.tp_rank
            for slot in slots:
                if shard_id == "w2" and channel:
                    _copy_checked(layer, weight_name, param.data[slot], loaded_weight)
                elif shard_id == "w2":
                    layer._load_w2(expert_data=param.data[slot], shard_dim=1,
                                   loaded_weight=loaded_weight, tp_rank=tp_rank)
                else:
                    layer._load_w13(expert_data=param.data[slot], shard_dim=0,
                                    shard_id=shard_id, loaded_weight=loaded_weight,
                                    tp_rank=tp_rank)
            return bool(slots) if return_success else None

        load.supports_moe_loading = True
        return load

    # ---- forward ---------------------------------------------------------------------
    def apply_monolithic(self, layer, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        weights, ids = select_experts(layer, x, router_logits)
        slots = expert_map.to_physical(ids, self.log2phy, self.replicas)
        # EPLB's load window (graph-capturable), without a graph batch's padding rows
        expert_map.count_pairs(self.expert_load, slots, _padding_rows(slots.shape[0]))
        weights = weights.to(x.dtype)
        if layer.apply_router_weight_on_input:  # top-1 (Llama 4): the expert sees x * w
            x, weights = x * weights, torch.ones_like(weights)
        experts = self.experts(layer)
        layout = self.layout
        if layout.ep_size == 1:
            return run_local_experts(x, weights, slots, experts, 0, layout.num_physical)
        options = self.options
        sizes = dispatch.dp_sizes() if layout.dp_size > 1 else None
        mode = dispatch.dispatch_mode(options.ep_dispatch, options.all_to_all_min_tokens,
                                      max(sizes) if sizes else x.shape[0], _capturing())
        if mode == "all_to_all":
            return dispatch.all_to_all_experts(x, weights, slots, experts, layout)
        return dispatch.all_gather_experts(x, weights, slots, experts, layout, sizes)


@UnquantizedFusedMoEMethod.register_oot
class NPUUnquantizedFusedMoEMethod(NPUMoEMethodMixin, UnquantizedFusedMoEMethod):

    def create_weights(self, layer, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        local = self._prepare(layer, extra_weight_attrs)
        super().create_weights(layer, local, hidden_size, intermediate_size_per_partition,
                               params_dtype, **extra_weight_attrs)
        self._finish(layer)


def _stacked_experts(layer, logical: int, rows: int) -> list[int]:
    """The logical experts of a stacked checkpoint tensor's rows: all of them, or under EP
    those vLLM's model loader kept (`expert_map != -1`, vLLM's linear split)."""
    if rows == logical:
        return list(range(rows))
    expert_map = getattr(layer, "expert_map", None)
    kept = [] if expert_map is None else (expert_map != -1).nonzero().flatten().tolist()
    if len(kept) != rows:
        raise ValueError(f"{layer.layer_name}: a stacked expert tensor of {rows} experts "
                         f"matches neither the model's {logical} nor the {len(kept)} "
                         "vLLM's loader keeps on this rank")
    return kept


def _copy_checked(layer, name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"{layer.layer_name}: {name} of shape {tuple(src.shape)} does not "
                         f"fit the expert's {tuple(dst.shape)}")
    dst.copy_(src)


def _initial_placement(config, layer_id: int, experts: int,
                       ep_size: int) -> expert_map.ExpertPlacement:
    """The expert map file's placement, else linear plus EPLB's redundant replicas."""
    redundant = config.eplb.num_redundant_experts if config.eplb.enabled else 0
    path = config.moe.expert_map_path
    if not path:
        return expert_map.ExpertPlacement.spread(experts, ep_size, redundant)
    placement = expert_map.load_placement(path, layer_id, experts, ep_size)
    if redundant and placement.num_physical != experts + redundant:
        raise expert_map.ExpertMapError(
            f"expert map {path!r}, layer {layer_id}: {placement.num_physical} physical "
            f"experts, but --eplb-config num_redundant_experts={redundant} asks for "
            f"{experts} + {redundant} = {experts + redundant}")
    return placement


def _padding_rows(num_rows: int) -> torch.Tensor | None:
    """vLLM's mask of the rows its runner padded this forward's batch with, when it covers
    exactly these rows (a drafter's forward or a PCP chunk has none that fits: all count)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    padding = get_forward_context().is_padding
    return padding if padding is not None and padding.shape[0] == num_rows else None


def _capturing() -> bool:
    from vllm_npu.compilation.graph_backend import get_graph_backend

    return get_graph_backend().is_capturing()
