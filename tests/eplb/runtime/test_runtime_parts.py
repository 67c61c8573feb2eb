"""Pieces of the EPLB runtime on their own: the transfer schedule, the device-side load
window, the balancedness figure, EPLB's startup checks and the fault-injection variable."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_npu.eplb.runtime.recorder import LoadRecorder
from vllm_npu.eplb.runtime.transfer import plan_transfers
from vllm_npu.eplb.runtime.updator import balancedness
from vllm_npu.moe.expert_map import ExpertMapError, ExpertPlacement


def _placements(seed: int, experts: int, ranks: int, slots: int, n: int = 2):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        p = rng.permutation(list(range(experts)) +
                            rng.choice(experts, ranks * slots - experts).tolist())
        try:
            out.append(ExpertPlacement(experts, ranks, tuple(int(e) for e in p)))
        except ExpertMapError:
            pass
    return out


@pytest.mark.parametrize("seed", range(5))
def test_transfers_rebuild_the_new_placement(seed):
    old, new = _placements(seed, experts=10, ranks=4, slots=4)
    transfers = plan_transfers(old.phy2log, new.phy2log, 4)
    result = list(old.phy2log)
    for t in transfers:
        assert old.phy2log[t.src_slot] == t.expert  # read from the old placement
        assert (t.dst_rank, t.src_rank) == (t.slot // 4, t.src_slot // 4)
        own = [q for q in range(16) if q // 4 == t.dst_rank and old.phy2log[q] == t.expert]
        assert t.local == bool(own)  # a rank that held the expert copies its own
        result[t.slot] = t.expert
    assert result == list(new.phy2log)
    assert {t.slot for t in transfers} == {p for p in range(16)
                                           if old.phy2log[p] != new.phy2log[p]}


def test_remote_sources_share_the_sending():
    # expert 0 held by ranks 0 and 1; ranks 2 and 3 both need it: one sender each
    old = (0, 1, 0, 2, 3, 4, 5, 6)
    new = (0, 1, 0, 2, 0, 4, 0, 6)
    senders = sorted(t.src_rank for t in plan_transfers(old, new, 2))
    assert senders == [0, 1]


class _Method:
    def __init__(self, placement):
        self.placement = placement
        self.expert_load = torch.zeros(placement.num_physical, dtype=torch.int64)


def _views(placements):
    return [SimpleNamespace(placement=p, method=m, load=m.expert_load, layer_id=i)
            for i, (p, m) in enumerate((p, _Method(p)) for p in placements)]


def test_load_window_folds_steps_with_their_placement():
    a, b = _placements(7, experts=6, ranks=2, slots=4)
    views = _views([a, b])
    rec = LoadRecorder(views, window_size=2)
    rng = np.random.default_rng(0)
    steps = [rng.integers(0, 9, size=(2, 8)) for _ in range(3)]
    expected = []
    for i, counts in enumerate(steps):
        layers = [a, b] if i < 2 else [b, b]  # layer 0 switches placement before step 2
        if i == 2:
            views[0].method.placement = b
            rec.set_layer(0, b)
        for layer, view in enumerate(views):
            view.method.expert_load.add_(torch.from_numpy(counts[layer]))  # the MoE forward
        want = np.zeros((2, 6), np.int64)
        for layer in range(2):
            np.add.at(want[layer], list(layers[layer].phy2log), counts[layer])
        expected.append(want)
        rec.record()
        assert not rec.step.any()
    # a window of 2 keeps the last two steps
    np.testing.assert_array_equal(rec.window_load().numpy(), expected[1] + expected[2])
    views[1].method.expert_load.add_(5)
    rec.discard()
    np.testing.assert_array_equal(rec.window_load().numpy(), expected[1] + expected[2])


def test_balancedness_is_mean_over_max_rank_load():
    load = np.array([[8.0, 2.0, 2.0, 4.0]])
    phy2log = np.array([[0, 1, 2, 0, 3, 1]])  # 2 ranks x 3 slots
    # experts 0 and 1 sit on both ranks: each replica carries half (4 and 1)
    rank0, rank1 = 4 + 1 + 2, 4 + 4 + 1
    assert balancedness(load, phy2log, 2) == pytest.approx(((rank0 + rank1) / 2) / rank1)
    assert balancedness(np.zeros((1, 4)), phy2log, 2) == 1.0


def test_spread_placement_and_graph_stable_tables():
    p = ExpertPlacement.spread(6, 2, 2)
    assert p.phy2log == (0, 1, 2, 3, 4, 5, 0, 1) and p.max_replicas == 2
    log2phy, replicas = ExpertPlacement.linear(6, 2).tables(width=2)
    assert log2phy.shape == (6, 2) and replicas.tolist() == [1] * 6
    assert ExpertPlacement.spread(8, 4, 0) == ExpertPlacement.linear(8, 4)
    with pytest.raises(ExpertMapError, match="6 experts \\+ 1 redundant = 7 physical"):
        ExpertPlacement.spread(6, 2, 1)


def test_fault_variable_parses_and_refuses(monkeypatch):
    from vllm_npu import envs

    monkeypatch.setenv("NPU_EPLB_FAIL_TRANSFER", "1:0, 3:1:timeout")
    assert envs.NPU_EPLB_FAIL_TRANSFER.get() == (envs.TransferFault(1, 0, "error"),
                                                 envs.TransferFault(3, 1, "timeout"))
    for bad in ("1", "a:0", "1:0:slow", "1:-1"):
        monkeypatch.setenv("NPU_EPLB_FAIL_TRANSFER", bad)
        with pytest.raises(ValueError, match="expected comma-separated"):
            envs.NPU_EPLB_FAIL_TRANSFER.get()


def test_plugin_eplb_key_is_validated():
    from vllm_npu.config import NPUConfig

    assert NPUConfig.from_additional_config({"eplb": {"policy": "swift"}}).eplb.policy == "swift"
    with pytest.raises(ValueError, match="eplb.policy='nope'.*valid: \\['default'"):
        NPUConfig.from_additional_config({"eplb": {"policy": "nope"}})
    with pytest.raises(ValueError, match="eplb.layer_per_step=2.*valid keys: .*layers_per_step"):
        NPUConfig.from_additional_config({"eplb": {"layer_per_step": 2}})


class _RoutedMethod(_Method):
    def set_placement(self, placement):
        self.placement = placement

    def slot_tensors(self, layer):
        return (layer.w13_weight, layer.w2_weight)


def test_a_slow_plan_never_stalls_a_step_and_then_moves_the_weights():
    """The policy blocks until released: steps keep running meanwhile; once the plan is
    ready the layer migrates (one rank: local copies) and routes by the new map."""
    import threading

    from vllm_npu.config import EplbOptions
    from vllm_npu.eplb.runtime.adaptor import MoELayerView
    from vllm_npu.eplb.runtime.transfer import EPGroup
    from vllm_npu.eplb.runtime.updator import EplbUpdator

    start = ExpertPlacement.linear(4, 1)
    w13 = torch.arange(4.0).view(4, 1, 1).expand(4, 6, 3).contiguous()
    w2 = torch.arange(4.0).view(4, 1, 1).expand(4, 3, 3).contiguous()
    layer = SimpleNamespace(w13_weight=w13, w2_weight=w2)
    method = _RoutedMethod(start)
    adaptor = SimpleNamespace(layers=[MoELayerView(5, layer, method)])
    group = EPGroup(None, None, rank=0, size=1, global_ranks=[0], tp_size=1)
    updator = EplbUpdator(adaptor, EplbOptions(enabled=True, window_size=2, step_interval=2),
                          group)
    release = threading.Event()

    def slow_policy(load, num_ranks, slots_per_rank, old_phy2log=None, **_):
        release.wait(30)
        return np.array([[3, 2, 1, 0]])

    updator.policy.rebalance = slow_policy
    for _ in range(2):
        updator.step()
    assert updator.state == "plan"
    for _ in range(5):  # each returns while the plan is still blocked
        updator.step()
    assert updator.state == "plan" and updator.total_steps == 7 and not updator.history
    release.set()
    updator._future.result(timeout=30)
    updator.step()
    assert updator.state == "collect"
    (rebalance,) = updator.history
    assert rebalance.layers_moved == [5] and rebalance.experts_moved == 4
    assert method.placement.phy2log == (3, 2, 1, 0)
    assert w13[:, 0, 0].tolist() == [3.0, 2.0, 1.0, 0.0]  # slot s now holds expert 3 - s
    assert w2[:, 0, 0].tolist() == [3.0, 2.0, 1.0, 0.0]
    updator.close()


def test_the_policy_gets_sub_windows_earlier_windows_and_its_deadline():
    """What the runtime hands the policy: the window as `sub_windows` runs of steps, oldest
    first (the counts each step recorded), the totals of the earlier windows (the policy's
    memory, kept by the runtime, `history_windows` of them), and `plan_deadline_s`."""
    from vllm_npu.config import EplbOptions
    from vllm_npu.eplb.runtime.adaptor import MoELayerView
    from vllm_npu.eplb.runtime.transfer import EPGroup
    from vllm_npu.eplb.runtime.updator import EplbUpdator

    start = ExpertPlacement.linear(4, 1)
    layer = SimpleNamespace(w13_weight=torch.zeros(4, 6, 3), w2_weight=torch.zeros(4, 3, 3))
    method = _RoutedMethod(start)
    adaptor = SimpleNamespace(layers=[MoELayerView(5, layer, method)])
    group = EPGroup(None, None, rank=0, size=1, global_ranks=[0], tp_size=1)
    options = EplbOptions(enabled=True, window_size=6, step_interval=6, sub_windows=3,
                          history_windows=2, plan_deadline_s=0.25)
    updator = EplbUpdator(adaptor, options, group)
    calls = []

    def spy(load, num_ranks, slots_per_rank, old_phy2log=None, history=None, deadline_s=None):
        calls.append((np.array(load), None if history is None else np.array(history),
                      deadline_s))
        return np.asarray(old_phy2log)  # keep the placement

    updator.policy.rebalance = spy
    rng = np.random.default_rng(3)
    steps = rng.integers(0, 9, size=(24, 4))
    for counts in steps:
        method.expert_load.add_(torch.from_numpy(counts))
        updator.step()
        if updator._future is not None:
            updator._future.result(timeout=30)
    assert len(calls) == 4  # every 6 steps
    for i, (load, history, deadline) in enumerate(calls):
        window = steps[6 * i:6 * i + 6]
        want = window.reshape(3, 2, 1, 4).sum(axis=1)  # 3 runs of 2 steps, [T, L, E]
        np.testing.assert_array_equal(load, want)
        earlier = [steps[6 * j:6 * j + 6].sum(axis=0)[None] for j in range(max(i - 2, 0), i)]
        if earlier:
            np.testing.assert_array_equal(history, np.stack(earlier))
        else:
            assert history is None
        assert deadline == 0.25
    updator.close()


def test_sub_windows_of_a_window_not_yet_full_hold_only_recorded_steps():
    placement = ExpertPlacement.linear(4, 1)
    views = _views([placement])
    rec = LoadRecorder(views, window_size=8)
    for n in (1, 2, 3):
        views[0].method.expert_load.add_(n)
        rec.record()
    subs = rec.sub_window_loads(8)  # 3 steps recorded: 3 sub-windows of one step
    assert subs[:, 0, 0].tolist() == [1, 2, 3]
    assert rec.sub_window_loads(2)[:, 0, 0].tolist() == [3, 3]  # runs of 2 and 1 steps
