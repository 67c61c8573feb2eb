"""Expert placements: validation messages, the JSON file (vllm-ascend's expert_map_path
layout), replica tables, and logical -> physical routing."""
from __future__ import annotations

import json

import pytest
import torch

from vllm_npu.moe.expert_map import (
    ExpertMapError,
    ExpertPlacement,
    count_pairs,
    dump_placements,
    load_placement,
    to_physical,
)


def _write(tmp_path, layers: dict[int, list[list[int]]]) -> str:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"moe_layer_count": len(layers), "layer_list": [
        {"layer_id": lid, "device_count": len(devs),
         "device_list": [{"device_id": d, "device_expert": e} for d, e in enumerate(devs)]}
        for lid, devs in layers.items()]}))
    return str(path)


def test_linear_and_replica_tables():
    linear = ExpertPlacement.linear(8, 2)
    assert linear.local_experts(1) == [4, 5, 6, 7]
    placed = ExpertPlacement(4, 2, (0, 1, 2, 3, 0, 2))
    log2phy, replicas = placed.tables()
    assert replicas.tolist() == [2, 1, 2, 1]
    assert log2phy.tolist() == [[0, 4], [1, 1], [2, 5], [3, 3]]
    ids = torch.tensor([[0, 2]] * 4, dtype=torch.int32)
    slots = to_physical(ids, log2phy, replicas)
    # Token t takes replica (t + j) % count: the two copies of 0 and of 2 share the load.
    assert slots.tolist() == [[0, 5], [4, 2], [0, 5], [4, 2]]
    for p, e in enumerate(placed.phy2log):  # every slot holds what routing asks of it
        assert e == int(torch.nonzero(log2phy == p)[0, 0])


@pytest.mark.parametrize("experts, ep, phy2log, match", [
    (4, 2, (0, 1, 2), "do not split evenly"),
    (4, 2, (0, 1, 2, 2), r"experts \[3\] are placed on no rank"),
    (4, 2, (0, 1, 2, 9), r"expert ids \[9\] are outside"),
    (4, 2, (0, 0, 1, 2, 3, 1), "holds a replica twice"),
])
def test_placement_refusals(experts, ep, phy2log, match):
    with pytest.raises(ExpertMapError, match=match):
        ExpertPlacement(experts, ep, phy2log)
    with pytest.raises(ExpertMapError, match="give an expert map with replicas"):
        ExpertPlacement.linear(6, 4)


def test_file_round_trip_and_refusals(tmp_path):
    path = _write(tmp_path, {1: [[0, 1, 2], [3, 0, 2]], 2: [[3, 2, 1], [0, 1, 2]]})
    first = load_placement(path, 1, 4, 2)
    assert first.phy2log == (0, 1, 2, 3, 0, 2)
    out = tmp_path / "out.json"
    dump_placements({1: first, 2: load_placement(path, 2, 4, 2)}, str(out))
    assert json.loads(out.read_text()) == json.loads(open(path).read())

    with pytest.raises(ExpertMapError, match="no entry for MoE layer 3"):
        load_placement(path, 3, 4, 2)
    with pytest.raises(ExpertMapError, match="this engine has 4 expert-parallel rank"):
        load_placement(path, 1, 4, 4)
    with pytest.raises(ExpertMapError, match="outside the model's 3 experts"):
        load_placement(path, 1, 3, 2)
    uneven = _write(tmp_path, {0: [[0, 1], [2, 3, 0]]})
    with pytest.raises(ExpertMapError, match="the same number of experts"):
        load_placement(uneven, 0, 4, 2)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ExpertMapError, match="cannot read expert map"):
        load_placement(str(bad), 0, 4, 2)


def test_count_pairs_adds_each_real_tokens_slots_and_skips_padding_rows():
    """Counts per slot equal a bincount of the real rows' slots (a graph batch of 6 holding
    4 tokens: rows 4 and 5 are padding); without a mask every row counts."""
    slots = torch.tensor([[0, 3], [3, 1], [2, 0], [3, 3], [1, 1], [0, 2]], dtype=torch.int32)
    padding = torch.tensor([False] * 4 + [True] * 2)
    load = torch.full((4,), 7, dtype=torch.int64)
    count_pairs(load, slots, padding)
    want = torch.bincount(slots[:4].flatten().long(), minlength=4) + 7
    assert load.tolist() == want.tolist()
    count_pairs(load, slots)
    assert load.tolist() == (want + torch.bincount(slots.flatten().long(), minlength=4)).tolist()
