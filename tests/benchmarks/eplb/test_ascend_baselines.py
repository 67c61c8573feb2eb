"""The adaptor that runs vllm-ascend's policies as benchmark baselines, on a stand-in
source tree with the same interface (the real files come from the pinned wheel)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.eplb.ascend_baselines import PACKAGE_DIR, AscendBaseline, slot_load

FAKE_FLASHLB = '''
import numpy as np
from vllm_ascend.distributed.parallel_state import get_dynamic_eplb_group
from .policy_abstract import EplbPolicy

CALLS = []

class FlashLB(EplbPolicy):
    def rebalance_experts(self, table, workload):
        try:
            get_dynamic_eplb_group()
        except RuntimeError:
            pass
        CALLS.append((np.array(table), np.array(workload)))
        return True, np.arange(table.shape[0]), np.array(table)[:, ::-1, :]
'''


def _tree(tmp_path: Path) -> Path:
    pkg = tmp_path / PACKAGE_DIR
    pkg.mkdir(parents=True)
    (pkg / "policy_abstract.py").write_text("class EplbPolicy:\n    pass\n")
    (pkg / "policy_flashlb.py").write_text(FAKE_FLASHLB)
    return tmp_path


def test_slot_load_splits_each_expert_over_its_replicas() -> None:
    load = np.array([[[6.0, 2.0, 4.0]]])            # [T=1, L=1, E=3]
    phy2log = np.array([[0, 1, 0, 2]])               # expert 0 twice
    assert slot_load(load, phy2log).tolist() == [[[3.0, 2.0, 3.0, 4.0]]]


def test_adaptor_feeds_per_slot_windows_and_maps_the_table_back(tmp_path: Path) -> None:
    before = set(sys.modules)
    pol = AscendBaseline("va-flashlb", _tree(tmp_path), num_ranks=2)
    rng = np.random.default_rng(0)
    load = rng.integers(1, 100, size=(3, 2, 4)).astype(float)   # [T, L, E]
    old = np.array([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 2, 3]])     # D=2, S=3
    new = pol.rebalance(load, num_ranks=2, slots_per_rank=3, old_phy2log=old)
    calls = sys.modules["vllm_ascend.eplb.core.policy.policy_flashlb"].CALLS
    table, workload = calls[-1]
    assert table.tolist() == old.reshape(2, 2, 3).tolist()
    assert workload.shape == (3, 2, 2, 3)                       # [T, L, D, S] per slot
    # summing the per-slot load back per expert recovers the expert load
    for layer in range(2):
        back = np.zeros((3, 4))
        for slot, expert in enumerate(old[layer]):
            back[:, expert] += workload[:, layer].reshape(3, -1)[:, slot]
        assert np.allclose(back, load[:, layer])
    assert new.tolist() == old.reshape(2, 2, 3)[:, ::-1, :].reshape(2, 6).tolist()
    # stand-ins are gone after the call; only the loaded policy modules stay
    assert "torch_npu" not in set(sys.modules) - before
    assert "vllm_ascend.distributed.parallel_state" not in sys.modules


def test_first_call_starts_from_the_static_round_robin(tmp_path: Path) -> None:
    for name in [k for k in sys.modules if k.startswith("vllm_ascend")]:
        del sys.modules[name]
    pol = AscendBaseline("va-flashlb", _tree(tmp_path), num_ranks=2)
    pol.rebalance(np.ones((1, 5)), num_ranks=2, slots_per_rank=3)
    table, _ = sys.modules["vllm_ascend.eplb.core.policy.policy_flashlb"].CALLS[-1]
    assert table.reshape(-1).tolist() == [0, 1, 2, 3, 4, 0]
