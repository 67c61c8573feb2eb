"""Sleep mode without a CuMem allocator: free and restore tensors' storages in place.

    level 1: weights copied to host, their device storage freed; KV cache freed
    level 2: weights and KV cache freed (only module buffers, which checkpoints do not
             hold, are kept on host); the caller reloads weights after waking up
    wake_up(tags): storages re-allocated at the same size; "weights" restores the host
                   copy (level 1) or the buffers (level 2); "kv_cache" comes back zeroed

Storages are resized in place (`untyped_storage().resize_`), so every parameter, view and
layer binding of the KV cache stays valid across a sleep; only the bytes come and go.
"""
from __future__ import annotations

import torch

WEIGHTS, KV_CACHE = "weights", "kv_cache"


def _unique_storages(tensors) -> dict[int, torch.UntypedStorage]:
    out: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        st = t.untyped_storage()
        out.setdefault(st.data_ptr(), st)
    return out


class SleepState:
    def __init__(self) -> None:
        self.level = 0
        self._asleep: dict[str, list[tuple[torch.UntypedStorage, int]]] = {}
        self._host_params: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._host_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    def sleep(self, level: int, model: torch.nn.Module, kv_caches) -> int:
        """Free device memory; returns the bytes freed."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self._asleep:
            raise RuntimeError(f"already asleep ({sorted(self._asleep)}); wake up first")
        params = [p.data for p in model.parameters()]
        buffers = [b for b in model.buffers()]
        if level == 1:
            self._host_params = [(p, p.detach().to("cpu", copy=True)) for p in params]
        self._host_buffers = [(b, b.detach().to("cpu", copy=True)) for b in buffers]
        self.level = level
        freed = self._free(WEIGHTS, params + buffers)
        freed += self._free(KV_CACHE, kv_caches)
        return freed

    def _free(self, tag: str, tensors) -> int:
        storages = _unique_storages(tensors)
        self._asleep[tag] = [(st, st.nbytes()) for st in storages.values()]
        for st, _ in self._asleep[tag]:
            st.resize_(0)
        return sum(n for _, n in self._asleep[tag])

    def wake_up(self, tags: list[str] | None = None) -> None:
        for tag in tags or [WEIGHTS, KV_CACHE]:
            if tag not in (WEIGHTS, KV_CACHE):
                raise ValueError(f"unknown wake-up tag {tag!r}; valid: {WEIGHTS!r}, "
                                 f"{KV_CACHE!r}")
            for st, nbytes in self._asleep.pop(tag, []):
                st.resize_(nbytes)
                if tag == KV_CACHE:
                    torch.empty(0, dtype=torch.uint8, device=st.device).set_(st).zero_()
            if tag == WEIGHTS:
                for dst, src in self._host_params + self._host_buffers:
                    dst.copy_(src)
                self._host_params, self._host_buffers = [], []
