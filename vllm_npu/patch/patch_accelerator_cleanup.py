"""Patch: run vLLM's end-of-engine cleanup with the simulated NPU's accelerator cache calls.

What: wraps `cleanup_dist_env_and_memory` (in `vllm.distributed.parallel_state` and the
    names re-bound in `vllm.distributed` and `vllm.v1.engine.core`) so that it runs inside
    `vllm_npu.worker.accelerator.npu_runtime()`: its `empty_cache()` gives the heap's free
    pages back (the simulated device memory of the engine just shut down), its
    `empty_host_cache()` has nothing to free.
Why: after tearing down the process groups it calls `torch.accelerator.empty_cache()` /
    `empty_host_cache()` unless `current_platform.is_cpu()`; an out-of-tree platform is
    never "cpu", and on a CPU build of torch those calls raise ("Cannot access accelerator
    device when none is available") during every engine shutdown. No platform hook decides
    this; the engine core, not the worker, calls it, so the worker's scoped no-ops do not
    cover it.
Applies: only on the simulated NPU; a real NPU has an accelerator and needs no patch.
Remove when: vLLM asks the platform (e.g. an `empty_cache` platform method) instead of
    testing `is_cpu()`.
"""
from __future__ import annotations

import functools
import inspect

_MARK = "_vllm_npu_patched"


def _wrap(fn):
    from vllm_npu.worker.accelerator import npu_runtime

    @functools.wraps(fn)
    def cleanup(*args, **kwargs):
        with npu_runtime():
            return fn(*args, **kwargs)

    setattr(cleanup, _MARK, True)
    return cleanup


def applies() -> bool:
    from vllm_npu.device import select_backend

    return select_backend().simulated


def apply() -> None:
    import vllm.distributed as dist
    import vllm.distributed.parallel_state as ps
    import vllm.v1.engine.core as core

    original = ps.cleanup_dist_env_and_memory
    if getattr(original, _MARK, False):
        return  # idempotent
    # Guard: if upstream stopped calling empty_cache here, the patch is obsolete.
    if "torch.accelerator.empty_cache" not in inspect.getsource(original):
        return
    wrapped = _wrap(original)
    for module in (ps, dist, core):
        if getattr(module, "cleanup_dist_env_and_memory", None) is original:
            module.cleanup_dist_env_and_memory = wrapped
