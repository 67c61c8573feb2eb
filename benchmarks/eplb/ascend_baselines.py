"""vllm-ascend's own EPLB policies, run unmodified as benchmark baselines.

The policy files (``vllm_ascend/eplb/core/policy/``) are taken from the published
``vllm-ascend`` wheel on PyPI (:data:`VERSION`), never copied into this repository:
:func:`ensure_source` downloads the wheel once into a cache folder and extracts that one
folder. The files import a few things that only exist on an Ascend host; they get inert
stand-ins for the duration of the import and the call (:func:`_ascend_stand_ins`):

* ``vllm_ascend.distributed.parallel_state.get_dynamic_eplb_group`` raises, which FlashLB
  catches (it then keeps its default thresholds, those of a >= 32-rank group);
* ``torch_npu`` is an empty module and ``torch.npu.device_count()`` returns the rank count
  (SwiftBalance reads it as dies per host; one host holds every rank here).

Their interface differs from ours: they take the current table ``[L, D, S]`` and the load
per *physical slot* (what the device counters record), FlashLB as ``[T, L, D, S]``
sub-windows, the others summed to ``[L, D, S]``. :class:`AscendBaseline` converts: a slot's
load is its expert's load split evenly over that expert's replicas. vllm-ascend's runtime
applies the returned table for every layer (``eplb_worker.py`` ignores the ``changed`` and
priority outputs), and so does the adaptor.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

VERSION = "0.23.0"
PACKAGE_DIR = "vllm_ascend/eplb/core/policy"
# name in our benchmark -> (module file, class name)
BASELINES: dict[str, tuple[str, str]] = {
    "va-flashlb": ("policy_flashlb", "FlashLB"),
    "va-swift": ("policy_swift_balancer", "SwiftBalanceEplb"),
    "va-default": ("policy_default_eplb", "DefaultEplb"),
}
_PKG = "vllm_ascend.eplb.core.policy"


def ensure_source(cache_dir: Path) -> Path:
    """The folder holding ``vllm_ascend/eplb/core/policy`` from the pinned wheel."""
    root = cache_dir / f"vllm-ascend-{VERSION}"
    if (root / PACKAGE_DIR / "policy_flashlb.py").is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    # The x86_64 cp311 wheel: only its pure-Python policy files are read.
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"vllm-ascend=={VERSION}", "--no-deps",
         "--only-binary=:all:", "--python-version", "3.11", "--platform",
         "manylinux_2_34_x86_64", "-d", str(cache_dir), "-q"], check=True)
    wheel = next(cache_dir.glob(f"vllm_ascend-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(PACKAGE_DIR + "/") and name.endswith(".py"):
                zf.extract(name, root)
    return root


@contextlib.contextmanager
def _ascend_stand_ins(num_ranks: int) -> Iterator[None]:
    """Install the stand-ins named in the module docstring; restore everything after."""
    import torch

    def no_group():
        raise RuntimeError("no dynamic EPLB group outside an Ascend runtime")

    fakes = {
        "vllm_ascend": types.ModuleType("vllm_ascend"),
        "vllm_ascend.distributed": types.ModuleType("vllm_ascend.distributed"),
        "vllm_ascend.distributed.parallel_state":
            types.ModuleType("vllm_ascend.distributed.parallel_state"),
        "torch_npu": types.ModuleType("torch_npu"),
    }
    fakes["vllm_ascend.distributed.parallel_state"].get_dynamic_eplb_group = no_group
    saved = {k: sys.modules.get(k) for k in fakes}
    had_npu = hasattr(torch, "npu")
    old_npu = getattr(torch, "npu", None)
    for k, mod in fakes.items():
        if k != "torch_npu" or k not in sys.modules:
            sys.modules[k] = mod
    if not had_npu:
        torch.npu = types.SimpleNamespace(device_count=lambda: num_ranks)
    try:
        yield
    finally:
        for k, mod in saved.items():
            if mod is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = mod
        if not had_npu:
            del torch.npu
        else:
            torch.npu = old_npu


def _load_module(root: Path, module: str) -> types.ModuleType:
    """Import one policy file as ``vllm_ascend.eplb.core.policy.<module>``."""
    full = f"{_PKG}.{module}"
    if full in sys.modules:
        return sys.modules[full]
    for parent in ("vllm_ascend.eplb", "vllm_ascend.eplb.core", _PKG):
        if parent not in sys.modules:
            pkg = types.ModuleType(parent)
            pkg.__path__ = [str(root / parent.replace(".", "/"))]
            sys.modules[parent] = pkg
    for dep in ("policy_abstract", module):
        name = f"{_PKG}.{dep}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, root / PACKAGE_DIR / f"{dep}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[full]


def initial_placement(num_layers: int, num_experts: int, num_slots: int) -> np.ndarray:
    """vLLM's static start: slot ``i`` holds expert ``i % E`` on every layer."""
    return np.tile(np.arange(num_slots, dtype=np.int64) % num_experts, (num_layers, 1))


def slot_load(load: np.ndarray, phy2log: np.ndarray) -> np.ndarray:
    """Per-slot load ``[..., L, D*S]`` of expert load ``[..., L, E]`` under ``phy2log``."""
    e = load.shape[-1]
    cnt = np.stack([np.bincount(row, minlength=e) for row in phy2log])   # [L, E]
    per_replica = load / np.maximum(cnt, 1)
    idx = np.broadcast_to(phy2log, load.shape[:-1] + phy2log.shape[-1:])
    return np.take_along_axis(per_replica, idx, axis=-1)


class AscendBaseline:
    """One vllm-ascend policy behind our ``rebalance(load, D, S, old)`` call.

    Stateful like the original (FlashLB keeps its hotness window and thresholds between
    calls), so one instance serves one run of consecutive windows.
    """

    def __init__(self, name: str, source_root: Path, num_ranks: int) -> None:
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; valid: {', '.join(BASELINES)}")
        self.name = name
        self.num_ranks = num_ranks
        module, cls = BASELINES[name]
        with _ascend_stand_ins(num_ranks):
            self._impl: Any = getattr(_load_module(source_root, module), cls)()

    def rebalance(self, load: np.ndarray, num_ranks: int, slots_per_rank: int,
                  old_phy2log: np.ndarray | None = None, history: np.ndarray | None = None,
                  deadline_s: float | None = None) -> np.ndarray:
        # (vllm-ascend's policies take neither earlier windows nor a deadline)
        load = np.asarray(load, dtype=np.float64)
        windows = load if load.ndim == 3 else load[None]
        n_l, n_e = windows.shape[1:]
        n_slots = num_ranks * slots_per_rank
        old = (initial_placement(n_l, n_e, n_slots) if old_phy2log is None
               else np.asarray(old_phy2log, dtype=np.int64))
        table = old.reshape(n_l, num_ranks, slots_per_rank)
        per_slot = slot_load(windows, old).reshape(-1, n_l, num_ranks, slots_per_rank)
        with _ascend_stand_ins(num_ranks):
            if self.name == "va-flashlb":
                _, _, new = self._impl.rebalance_experts(table, per_slot)
            else:
                import torch

                # SwiftBalance calls .numpy() on its inputs; the default policy takes arrays.
                _, _, new = self._impl.rebalance_experts(
                    torch.from_numpy(table.copy()), torch.from_numpy(per_slot.sum(axis=0)))
        return np.asarray(new, dtype=np.int64).reshape(n_l, n_slots)
