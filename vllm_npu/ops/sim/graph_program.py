"""A simulated graph replay as a device runs one: the prepared launches in one native call.

A device replays a captured graph with one launch of its recorded tasks (CANN
`aclmdlRIExecuteAsync`); no host code runs between two kernels. `plan` turns a graph's
entries (graph.py `_Entry`) into the steps of a replay: each run of consecutive entries
with prepared launches becomes one `Program` (one `npu_sim_run` call through
`native.LaunchList`), every other entry runs as it is.

Before launching, a program checks that the memory its launches address is still there: a
task's addresses through its DeviceRefs (freed, moved or shrunk memory is refused, as
before the program); for the other entries, the storages of the tensors their launches
were prepared with (their addresses then), except the graph's own buffers. Sleep mode
resizes weight and KV cache storages in place (worker/sleep.py): a storage that moved is
prepared again from the entries' tensors, one smaller than at preparation is refused.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from vllm_npu.ops.sim import native
from vllm_npu.ops.sim.checks import NPUOpError


class Program:
    """Consecutive entries whose launches run as one native call."""

    def __init__(self, entries: list) -> None:
        self.entries = entries
        self.slots: dict[int, tuple[int, int]] = {}  # id(entry) -> (first launch, count)
        launches: list[native.Launch] = []
        for entry in entries:
            self.slots[id(entry)] = (len(launches), len(entry.launch))
            launches.extend(entry.launch)
        self.launches = native.LaunchList(launches)
        self.tasks = [e for e in entries if e.task]

    def replace(self, entry: Any) -> bool:
        """A task entry's new launch written into its slots; False where it does not fit
        (another number of launches: the graph plans again)."""
        first, count = self.slots[id(entry)]
        if not entry.native or len(entry.launch) != count:
            return False
        for i, launch in enumerate(entry.launch):
            self.launches.replace(first + i, launch)
        return True

    def run(self) -> None:
        for entry in self.tasks:
            name = entry.fn.__name__
            for ref in entry.refs:
                ref.check(name)
        self.launches()


def _storages(tree: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_leaves(tree)
            if isinstance(t, torch.Tensor)}


def _own_memory(entries: list, pool: list) -> set[int]:
    """The graph's own buffers: its captured allocations and the outputs its entries
    allocated (on a device, the graph's memory pool: torch_npu `NPUGraph::capture_begin`
    in csrc/core/npu/NPUGraph.cpp routes the capture's allocations to the graph's
    `MemPool`). Not an output that aliases an input (an in-place op on a weight or the KV
    cache), nor a captured view (a weight's `.data`): that memory is outside the pool and
    sleep mode moves it."""
    owned = _storages(pool)
    for entry in entries:
        if not entry.task:  # a task's outputs are its `out` arguments (graph.py)
            owned |= _storages(entry.outputs) - _storages((entry.args, entry.kwargs))
    return owned


def plan(entries: list, pool: list) -> tuple[list, list, dict[int, Program]]:
    """The replay's steps (a Program per run of consecutive entries with launches, the
    other entries as they are), the storages the non-task launches address outside the
    graph's own buffers (`_own_memory`; storage, address, bytes), and each task entry's
    Program."""
    owned = _own_memory(entries, pool)
    steps: list = []
    run: list = []
    for entry in entries:
        if entry.native:
            run.append(entry)
            continue
        if run:
            steps.append(Program(run))
            run = []
        steps.append(entry)
    if run:
        steps.append(Program(run))
    storages: dict[int, torch.UntypedStorage] = {}
    programs: dict[int, Program] = {}
    for step in steps:
        if not isinstance(step, Program):
            continue
        for entry in step.entries:
            if entry.task:
                programs[id(entry)] = step
                continue
            for launch in entry.launch:
                # the address each launch was prepared with, not the storage's address
                # now: planned first after a sleep, a launch prepared before it is stale
                for t, base in zip(launch.tensors, launch.bases):
                    st = t.untyped_storage()
                    if st.data_ptr() not in owned:
                        storages.setdefault(base, (st, base, st.nbytes()))
    return steps, list(storages.values()), programs


def unmoved(storages: list) -> bool:
    """True while every storage is where it was when the launches were prepared; False
    once one moved (the launches are prepared again); refuses one that shrank."""
    for st, ptr, nbytes in storages:
        if st.data_ptr() != ptr or st.nbytes() != nbytes:
            if st.nbytes() < nbytes:
                raise NPUOpError(f"graph replay: a kernel prepared at capture addresses "
                                 f"{nbytes} bytes of memory that now holds {st.nbytes()} "
                                 "(freed, e.g. by sleep mode); wake it up before replaying")
            return False
    return True
