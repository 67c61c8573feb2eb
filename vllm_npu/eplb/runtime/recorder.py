"""LoadRecorder: the EPLB load window, kept on the device.

    MoE forward   index_add into step[layer]          (counts per physical slot, this step)
    eplb step     window[pos] = step folded onto logical experts; step = 0   (3 device ops)
    rebalance     window -> T sub-window sums -> host  (the only sync, once per interval)

Each step is folded to logical experts with the placement it ran under, so a window that
spans a rebalance stays correct. The recorder hands each MoE layer its counter, a row of
one tensor (before graphs are captured, so replays count into it); the layer only adds to
the counter it holds (moe/expert_map.py `count_pairs`) and never imports the runtime.
"""
from __future__ import annotations

import torch

from vllm_npu.moe.expert_map import ExpertPlacement


class LoadRecorder:
    def __init__(self, views: list, window_size: int) -> None:
        first = views[0].placement
        self.num_layers, self.num_experts = len(views), first.num_experts
        self.num_physical = first.num_physical
        device = views[0].load.device
        self.step = torch.zeros(self.num_layers, self.num_physical, dtype=torch.int64,
                                device=device)
        for i, view in enumerate(views):  # adaptor.MoELayerView
            view.method.expert_load = self.step[i]
        self.window = torch.zeros(window_size, self.num_layers, self.num_experts,
                                  dtype=torch.int64, device=device)
        self._fold = torch.empty(self.num_layers * self.num_physical, dtype=torch.int64,
                                 device=device)
        for i, view in enumerate(views):
            self.set_layer(i, view.placement)
        self._pos = 0
        self._filled = 0  # steps of the window recorded since the last clear

    def set_layer(self, index: int, placement: ExpertPlacement) -> None:
        """Fold layer `index`'s later steps with this placement."""
        p = self.num_physical
        phy2log = torch.tensor(placement.phy2log, dtype=torch.int64, device=self._fold.device)
        self._fold[index * p:(index + 1) * p] = index * self.num_experts + phy2log

    def record(self) -> None:
        row = self.window[self._pos]
        row.zero_()
        row.view(-1).index_add_(0, self._fold, self.step.view(-1))
        self.step.zero_()
        self._pos = (self._pos + 1) % self.window.shape[0]
        self._filled = min(self._filled + 1, self.window.shape[0])

    def discard(self) -> None:
        """Forget this step's counts (dummy and profile batches)."""
        self.step.zero_()

    def clear(self) -> None:
        self.step.zero_()
        self.window.zero_()
        self._filled = 0

    def window_load(self) -> torch.Tensor:
        """[L, E] pairs per logical expert over the window (on the device)."""
        return self.window.sum(dim=0)

    def sub_window_loads(self, count: int) -> torch.Tensor:
        """[T, L, E]: the recorded steps of the window, oldest first, summed in T = min(count,
        steps recorded) consecutive runs of steps (their lengths differ by one at most)."""
        size = self.window.shape[0]
        n = max(self._filled, 1)
        order = torch.arange(self._pos - n, self._pos, device=self.window.device) % size
        steps = self.window.index_select(0, order)
        return torch.stack([part.sum(dim=0) for part in torch.tensor_split(steps, min(count, n))])

    def rank_tokens(self, ep_size: int) -> torch.Tensor:
        """[L, ep] pairs this step sent to each EP rank's slots."""
        return self.step.view(self.num_layers, ep_size, -1).sum(dim=-1)
