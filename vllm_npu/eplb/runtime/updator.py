"""EplbUpdator: the EPLB state machine of one worker, stepped once per engine step.

    collect ──every step_interval steps──> plan ──plan ready──> migrate ──all layers done──> collect
      │ record the step's load              │ EP rank 0 runs the      │ layers_per_step layers per step:
      │ (device ops only)                   │ policy in a thread;     │ transfer -> all ranks agree ->
      │                                     │ every step rank 0 says  │ commit, or roll that layer back
      │                                     │ whether it is ready     │
                                            └ the plan is broadcast   └ INFO "EPLB rebalance ..." at the end

Every EP rank steps in lockstep (vLLM runs dummy batches on idle DP ranks and calls
`eplb_step` for them), so the host collectives here line up. The old placement serves
until a layer's new weights are complete on every rank.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_npu.config import EplbOptions
from vllm_npu.eplb.runtime.adaptor import VllmEplbAdaptor
from vllm_npu.eplb.policy.metrics import rank_loads
from vllm_npu.eplb.policy import get_policy
from vllm_npu.eplb.runtime.recorder import LoadRecorder
from vllm_npu.eplb.runtime.transfer import (D2DExpertWeightLoader, EPGroup, plan_transfers,
                                    slot_bytes)
from vllm_npu.moe.expert_map import ExpertPlacement, dump_placements

logger = logging.getLogger("vllm.npu")


def balancedness(load: np.ndarray, phy2log: np.ndarray, ep_size: int) -> float:
    """vLLM's figure for logical load [L, E] under a placement (1.0 for no load)."""
    avg, peak = _avg_peak(rank_loads(load, phy2log, ep_size))
    return avg / peak if peak > 0 else 1.0


def _avg_peak(ranks: np.ndarray) -> tuple[float, float]:
    """vLLM's `_compute_eplb_load_stats`: per-layer mean and max EP-rank load of [L, D],
    each summed over layers."""
    return float(ranks.mean(axis=1).sum()), float(ranks.max(axis=1).sum())


@dataclass
class Rebalance:
    index: int
    balancedness_before: float
    balancedness_after: float
    layers_moved: list[int] = field(default_factory=list)
    experts_moved: int = 0
    bytes_moved: int = 0
    rolled_back: dict[int, list[int]] = field(default_factory=dict)  # layer -> EP ranks
    plan_s: float = 0.0
    transfer_s: float = 0.0
    total_s: float = 0.0
    step: int = 0  # engine step at which it completed


class EplbUpdator:
    def __init__(self, adaptor: VllmEplbAdaptor, options: EplbOptions, group: EPGroup,
                 export_path: str | None = None) -> None:
        self.views, self.options, self.group = adaptor.layers, options, group
        self.export_path = export_path
        first = self.views[0].placement
        if first.ep_size != group.size:
            raise ValueError(f"MoE placement over {first.ep_size} ranks, EP group of "
                             f"{group.size}")
        self.recorder = LoadRecorder(self.views, options.window_size)
        self.loader = D2DExpertWeightLoader(group, self.views[0].weights, first.slots_per_rank,
                                            options.transfer_timeout_s)
        self.policy = get_policy(options.policy, **options.policy_options)
        self._planner = (ThreadPoolExecutor(1, thread_name_prefix="eplb-plan")
                         if group.rank == 0 else None)
        # numba compiles the policy's kernels on first use (seconds on a cold cache): start
        # now, while the model loads; the engine's warm-up waits for it (finish_warm_up).
        # A separate instance: a policy with memory (lookahead) must not remember this load.
        warm = get_policy(options.policy, **options.policy_options)
        self._warm_up = None if self._planner is None else self._planner.submit(
            warm.rebalance, np.ones((1, first.num_experts)), first.ep_size,
            first.slots_per_rank)
        self.state = "collect"
        self.steps = 0  # since the last rebalance started
        self.total_steps = 0
        self.history: list[Rebalance] = []
        self.balancedness_log: list[tuple[int, float]] = []
        # EP rank 0: earlier windows' [L, E] totals, oldest first, handed to the policy
        self._windows: deque[np.ndarray] = deque(maxlen=max(options.history_windows, 1))
        self._future: Future | None = None
        self._pending: list[int] = []

    def finish_warm_up(self) -> None:
        """Block until the policy is compiled, so the first rebalance plans at full speed."""
        if self._warm_up is not None:
            start = time.perf_counter()
            self._warm_up.result()
            self._warm_up = None
            logger.info("vllm_npu: EPLB policy %r ready (waited %.2f s for its compilation)",
                        self.options.policy, time.perf_counter() - start)

    # ---- per step --------------------------------------------------------------------
    def step(self, is_dummy: bool = False, is_profile: bool = False) -> None:
        if is_profile:
            self.recorder.clear()
            return
        if is_dummy:
            self.recorder.discard()
        opts = self.options
        if opts.log_balancedness and self.total_steps % opts.log_balancedness_interval == 0:
            self._log_balancedness()
        # dummy steps record their (discarded: zero) counts too, so that every EP rank's
        # window covers the same steps and splits into the same sub-windows
        self.recorder.record()
        self.total_steps += 1
        self.steps += 1
        if self.state == "collect" and self.steps >= opts.step_interval:
            self.steps = 0
            self._start_plan()
        elif self.state == "plan":
            self._poll_plan()
        elif self.state == "migrate":
            self._migrate_some()

    def _log_balancedness(self) -> None:
        tokens = self.recorder.rank_tokens(self.group.size).double().cpu()
        tokens = self.group.all_reduce(tokens) / self.group.tp_size
        avg, peak = _avg_peak(tokens.numpy())
        value = avg / peak if peak > 0 else 0.0  # (vLLM logs 0 for an idle step)
        self.balancedness_log.append((self.total_steps, value))
        if self.group.rank == 0:
            logger.info("EPLB step: %d: avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f, "
                        "steps until the next rearrangement: %d", self.total_steps, avg,
                        int(peak), value, max(self.options.step_interval - self.steps, 0))

    # ---- plan ------------------------------------------------------------------------
    def _phy2log(self) -> np.ndarray:
        return np.array([v.placement.phy2log for v in self.views], dtype=np.int64)

    def _start_plan(self) -> None:
        opts = self.options
        subs = self.recorder.sub_window_loads(opts.sub_windows).double().cpu()
        subs = (self.group.all_reduce(subs) / self.group.tp_size).numpy()
        load = subs.sum(axis=0)
        old = self._phy2log()
        before = balancedness(load, old, self.group.size)
        self._current = Rebalance(len(self.history) + 1, before, before)
        self._load, self._old, self._t0 = load, old, time.perf_counter()
        if self._planner is not None:
            first = self.views[0].placement
            earlier = np.stack(self._windows) if self._windows else None
            self._future = self._planner.submit(
                self.policy.rebalance, subs, first.ep_size, first.slots_per_rank, old,
                history=earlier, deadline_s=opts.plan_deadline_s)
            if opts.history_windows:
                self._windows.append(load)
        self.state = "plan"
        self._poll_plan()

    def _poll_plan(self) -> None:
        ready = torch.tensor([int(self._future is not None and self._future.done())])
        if not self.group.broadcast(ready).item():
            return
        plan = torch.from_numpy(self._planned())
        new = self.group.broadcast(plan).numpy()
        self._current.plan_s = time.perf_counter() - self._t0
        self._plan = new
        self._pending = [i for i in range(len(self.views))
                         if not np.array_equal(new[i], self._old[i])]
        self._future = None
        self.state = "migrate"
        self._migrate_some()

    def _planned(self) -> np.ndarray:
        """EP rank 0: the policy's placement (the old one if it failed); others: a buffer."""
        if self._future is None:
            return np.empty_like(self._old)
        try:
            new = np.asarray(self._future.result(), dtype=np.int64)
            for i, view in enumerate(self.views):
                ExpertPlacement(view.placement.num_experts, self.group.size, tuple(new[i]))
            return new
        except Exception as e:  # a failed plan keeps the placement, never the engine down
            logger.warning("EPLB: policy %r failed (%s); keeping the current placement",
                           self.options.policy, e)
            return self._old.copy()

    # ---- migrate ---------------------------------------------------------------------
    def _migrate_some(self) -> None:
        for _ in range(min(self.options.layers_per_step, len(self._pending))):
            self._migrate_layer(self._pending.pop(0))
        if not self._pending:
            self._finish()

    def _migrate_layer(self, index: int) -> None:
        view, rec = self.views[index], self._current
        placement = view.placement
        new = ExpertPlacement(placement.num_experts, placement.ep_size,
                              tuple(int(e) for e in self._plan[index]))
        transfers = plan_transfers(placement.phy2log, new.phy2log, placement.slots_per_rank)
        start = time.perf_counter()
        error = self.loader.transfer(view.layer_id, view.weights, transfers)
        failed = torch.zeros(self.group.size, dtype=torch.int64)
        failed[self.group.rank] = int(error is not None)
        failed = self.group.all_reduce(failed).nonzero().flatten().tolist()
        if not failed:
            self.loader.commit(view.weights, transfers)
            view.method.set_placement(new)
            self.recorder.set_layer(index, new)
            if self.export_path and self.group.rank == 0:  # always the placement in use
                dump_placements({v.layer_id: v.placement for v in self.views},
                                self.export_path)
            rec.layers_moved.append(view.layer_id)
            rec.experts_moved += len(transfers)
            rec.bytes_moved += slot_bytes(view.weights) * sum(not t.local for t in transfers)
        else:
            rec.rolled_back[view.layer_id] = failed
            if error is not None:
                logger.warning("EPLB: layer %d: expert weight transfer failed on EP rank %d "
                               "(%s); layer rolled back, the old placement keeps serving",
                               view.layer_id, self.group.rank, error)
            elif self.group.rank == 0:
                logger.warning("EPLB: layer %d rolled back: transfer failed on EP rank(s) "
                               "%s; the old placement keeps serving", view.layer_id, failed)
        rec.transfer_s += time.perf_counter() - start

    def _finish(self) -> None:
        rec = self._current
        rec.balancedness_after = balancedness(self._load, self._phy2log(), self.group.size)
        rec.total_s = time.perf_counter() - self._t0
        rec.step = self.total_steps
        self.history.append(rec)
        self.state = "collect"
        if self.group.rank != 0:
            return
        logger.info(
            "EPLB rebalance #%d: balancedness %.4f -> %.4f (mean/max EP-rank load over the "
            "last %d steps), %d layer(s) and %d expert(s) moved (%.2f MiB), %d layer(s) "
            "rolled back, took %.3f s (plan %.3f s, transfer %.3f s)", rec.index,
            rec.balancedness_before, rec.balancedness_after, self.options.window_size,
            len(rec.layers_moved), rec.experts_moved, rec.bytes_moved / 2**20,
            len(rec.rolled_back), rec.total_s, rec.plan_s, rec.transfer_s)

    def close(self) -> None:
        if self._planner is not None:
            self._planner.shutdown(wait=False, cancel_futures=True)
