"""Logical -> physical expert placement with replicas, and its JSON file.

    EP rank:          0               1                    ep_size-1
    physical slot:  [0 .. S)       [S .. 2S)     ...    [(ep-1)S .. ep*S)      S = slots per rank
    phy2log[p]:     the logical expert whose weights slot p holds (every expert >= 1 slot)
    log2phy[e, r]:  the r-th slot holding expert e (padded by repeating), replicas[e] = count

Routing picks logical experts; `to_physical` turns them into slots (a token's replica is
chosen by its position, so replicas share the load without a host sync). A rank computes
its own slots only. The EPLB runtime changes `phy2log` and moves weights; nothing else.

The file is vllm-ascend's `expert_map_path` layout; `layer_id` is the decoder layer index
(`model.layers.<layer_id>.mlp`):

    {"moe_layer_count": 2,
     "layer_list": [{"layer_id": 1, "device_count": 2,
                     "device_list": [{"device_id": 0, "device_expert": [0, 1, 2]},
                                     {"device_id": 1, "device_expert": [3, 0, 2]}]}, ...]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch


class ExpertMapError(ValueError):
    """An expert map that does not fit the model or the expert-parallel size."""


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    ep_size: int
    phy2log: tuple[int, ...]

    def __post_init__(self) -> None:
        slots, ep = len(self.phy2log), self.ep_size
        if ep < 1 or slots % ep or slots == 0:
            raise ExpertMapError(f"{slots} physical experts do not split evenly over "
                                 f"{ep} expert-parallel ranks")
        bad = sorted({e for e in self.phy2log if not 0 <= e < self.num_experts})
        if bad:
            raise ExpertMapError(f"expert ids {bad} are outside the model's "
                                 f"{self.num_experts} experts (0..{self.num_experts - 1})")
        missing = sorted(set(range(self.num_experts)) - set(self.phy2log))
        if missing:
            raise ExpertMapError(f"experts {missing} are placed on no rank")
        for rank in range(ep):
            local = self.local_experts(rank)
            if len(set(local)) != len(local):
                raise ExpertMapError(f"rank {rank} holds a replica twice: {local}")

    @classmethod
    def linear(cls, num_experts: int, ep_size: int) -> "ExpertPlacement":
        """Experts in order, num_experts / ep_size per rank (vLLM's linear placement)."""
        if num_experts % ep_size:
            raise ExpertMapError(
                f"{num_experts} experts do not split evenly over {ep_size} expert-parallel "
                "ranks; give an expert map with replicas (additional-config "
                "moe.expert_map_path) so every rank holds the same number")
        return cls(num_experts, ep_size, tuple(range(num_experts)))

    @classmethod
    def spread(cls, num_experts: int, ep_size: int, redundant: int) -> "ExpertPlacement":
        """Slot p holds expert p % num_experts: the linear placement followed by one extra
        replica each of experts 0..redundant-1 (EPLB's starting point)."""
        if not redundant:
            return cls.linear(num_experts, ep_size)
        slots = num_experts + redundant
        if slots % ep_size:
            raise ExpertMapError(
                f"{num_experts} experts + {redundant} redundant = {slots} physical experts "
                f"do not split evenly over {ep_size} expert-parallel ranks")
        return cls(num_experts, ep_size, tuple(p % num_experts for p in range(slots)))

    @property
    def max_replicas(self) -> int:
        """Most slots any placement of this shape can give one expert (every expert keeps
        one slot, a rank holds an expert once): the width of graph-stable tables."""
        return min(self.ep_size, 1 + self.num_physical - self.num_experts)

    @property
    def slots_per_rank(self) -> int:
        return len(self.phy2log) // self.ep_size

    @property
    def num_physical(self) -> int:
        return len(self.phy2log)

    def local_experts(self, rank: int) -> list[int]:
        s = self.slots_per_rank
        return list(self.phy2log[rank * s:(rank + 1) * s])

    def tables(self, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log2phy [E, width] int64, replicas [E] int64); width defaults to this
        placement's most replicas (max_replicas keeps the shape across placements)."""
        slots: list[list[int]] = [[] for _ in range(self.num_experts)]
        for p, e in enumerate(self.phy2log):
            slots[e].append(p)
        width = width or max(len(s) for s in slots)
        log2phy = torch.tensor([(s * width)[:width] for s in slots], dtype=torch.int64)
        replicas = torch.tensor([len(s) for s in slots], dtype=torch.int64)
        return log2phy, replicas

    def to_json_layer(self, layer_id: int) -> dict:
        return {"layer_id": layer_id, "device_count": self.ep_size,
                "device_list": [{"device_id": r, "device_expert": self.local_experts(r)}
                                for r in range(self.ep_size)]}


def to_physical(topk_ids: torch.Tensor, log2phy: torch.Tensor,
                replicas: torch.Tensor) -> torch.Tensor:
    """Logical top-k ids [T, k] -> physical slots [T, k] int32; token t takes replica
    (t + j) % replicas[e] of its j-th expert e (tensor ops only: graph-capturable)."""
    ids = topk_ids.long()
    t = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    j = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    replica = (t + j) % replicas[ids]
    return log2phy[ids, replica].to(torch.int32)


def count_pairs(load: torch.Tensor, slots: torch.Tensor,
                padding: torch.Tensor | None = None) -> None:
    """Add a batch's (token, slot) pairs to a per-slot counter: device ops only, so it is
    captured into graphs with the MoE layer. `padding` [T] bool marks the rows a graph's
    batch size added (vLLM's forward-context `is_padding`, refilled before every replay):
    they route like tokens but are not load, so they add 0. The counter is the layer's own
    until EPLB's runtime hands it a row of its load window (eplb/runtime/recorder.py)."""
    flat = slots.reshape(-1).long()
    if padding is None:
        ones = torch.ones_like(flat)
    else:
        ones = padding.logical_not().long().unsqueeze(1).expand(slots.shape).reshape(-1)
    load.index_add_(0, flat, ones)


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ExpertMapError(f"cannot read expert map {path!r}: {e}") from None


def load_placement(path: str, layer_id: int, num_experts: int,
                   ep_size: int) -> ExpertPlacement:
    """The placement of decoder layer `layer_id` from an expert-map file, validated."""
    raw = _read(path)
    try:
        layers = {int(entry["layer_id"]): entry for entry in raw["layer_list"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ExpertMapError(f"expert map {path!r}: expected {{'layer_list': [{{'layer_id': "
                             f"..., 'device_count': ..., 'device_list': [...]}}]}} ({e!r})"
                             ) from None
    if layer_id not in layers:
        raise ExpertMapError(f"expert map {path!r} has no entry for MoE layer {layer_id} "
                             f"(it lists layers {sorted(layers)})")
    entry = layers[layer_id]
    devices = sorted(entry.get("device_list", []), key=lambda d: d.get("device_id", -1))
    if entry.get("device_count") != ep_size or len(devices) != ep_size or \
            [d.get("device_id") for d in devices] != list(range(ep_size)):
        raise ExpertMapError(
            f"expert map {path!r}, layer {layer_id}: device_count "
            f"{entry.get('device_count')} with device ids "
            f"{[d.get('device_id') for d in devices]}; this engine has {ep_size} "
            f"expert-parallel rank(s) (ids 0..{ep_size - 1})")
    lists = [list(d.get("device_expert", [])) for d in devices]
    if len({len(x) for x in lists}) != 1:
        raise ExpertMapError(f"expert map {path!r}, layer {layer_id}: every rank must hold "
                             f"the same number of experts, got {[len(x) for x in lists]}")
    try:
        return ExpertPlacement(num_experts, ep_size, tuple(e for x in lists for e in x))
    except ExpertMapError as e:
        raise ExpertMapError(f"expert map {path!r}, layer {layer_id}: {e}") from None


def dump_placements(placements: dict[int, ExpertPlacement], path: str) -> None:
    doc = {"moe_layer_count": len(placements),
           "layer_list": [p.to_json_layer(i) for i, p in sorted(placements.items())]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)



def export_placements(placements: dict[int, ExpertPlacement], path: str) -> str | None:
    """Write the placements from EP rank 0 (per pipeline stage: `<path>.pp<stage>` when
    there are several). Returns the path written, if any."""
    from vllm.distributed import get_ep_group, get_pp_group

    if not placements or get_ep_group().rank_in_group != 0:
        return None
    pp = get_pp_group()
    target = path if pp.world_size == 1 else f"{path}.pp{pp.rank_in_group}"
    dump_placements(placements, target)
    return target
