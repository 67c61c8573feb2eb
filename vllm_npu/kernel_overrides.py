"""vLLM Triton kernels the NPU platform replaces (`Platform.register_triton_kernel_overrides`).

vLLM's dispatcher routes each launch to the replacement with the kernel's arguments in
order. Both replacements are vectorised torch, on the simulated NPU and on a device.
"""
from __future__ import annotations

import importlib
import sys
import warnings


def _modules_that_break_the_scan() -> dict[str, object]:
    """Modules holding an object whose `vars()` is not a mapping (llvmlite's lazy `lib`,
    present once numba is imported). vLLM 0.33's `register_kernels` scans every module
    attribute with `vars(value).get(...)` and crashes on such an object; none of these
    modules can hold a vLLM kernel, so they are hidden from the scan. Remove when vLLM's
    dispatcher guards that call."""
    bad = {}
    # looking at deprecated objects (torch.distributed.reduce_op) warns; the scan is ours
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None) or {}
            for value in list(namespace.values()):
                try:
                    breaks = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
                except Exception:
                    breaks = True
                if breaks:
                    bad[name] = module
                    break
    return bad


def overrides() -> dict[str, object]:
    from vllm_npu.attention import context_parallel
    from vllm_npu.spec_decode import eagle_kernels, rejection_kernels
    from vllm_npu.worker import slot_mapping, state_copy

    return {slot_mapping.KERNEL: slot_mapping.compute_slot_mapping,
            state_copy.KERNEL: state_copy.batch_memcpy,
            context_parallel.CORRECT_KERNEL: context_parallel.correct_attn_cp_out,
            **rejection_kernels.KERNELS, **eagle_kernels.KERNELS}


def register_kernel_overrides() -> None:
    from vllm.triton_utils.dispatcher import register_kernels

    table = overrides()
    hidden = _modules_that_break_the_scan()
    for name in hidden:
        del sys.modules[name]
    try:
        register_kernels(table)
    finally:
        sys.modules.update(hidden)
    for name, impl in table.items():
        names = getattr(impl, "constexprs", None)  # needed by launchers that count them
        if names is None:
            continue
        module, owner, attr = name.rsplit(".", 2)
        wrapper = getattr(getattr(importlib.import_module(module), owner), attr)
        if getattr(wrapper, "constexprs", None) is None:
            wrapper.constexprs = names
