"""Monkey-patches of vLLM: the last resort, one file each, all listed in `PATCHES`.

Each `patch_<what>.py` says what it changes, why vLLM's interface forces it and when it
can go; it has `applies()` (is it needed on this backend) and an idempotent `apply()` that
checks upstream still has the shape it patches. Everything else goes through vLLM's own
hooks (platform methods, CustomOp.register_oot, register_backend, register_kernels,
worker/runner subclasses).
"""
from __future__ import annotations

import importlib

PATCHES: tuple[str, ...] = ("patch_accelerator_cleanup", "patch_parallel_config_eplb",
                             "patch_v1_runner_pcp")


def apply_all() -> list[str]:
    """Apply every patch that applies here; returns the names applied."""
    applied = []
    for name in PATCHES:
        module = importlib.import_module(f"{__name__}.{name}")
        if module.applies():
            module.apply()
            applied.append(name)
    return applied
