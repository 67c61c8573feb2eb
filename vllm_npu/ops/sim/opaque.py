"""Simulated ops that compiled code calls, registered as opaque custom ops (`npu_sim::*`).

On a device every op of the surface is a torch_npu operator: Dynamo records a call to it
in the graph and never looks inside (op-plugin registers them with the dispatcher,
`op_plugin/config/op_plugin_functions.yaml`). The simulated ops are Python: traced into,
their host-side decisions (which matmul kernel, cached probes of the host) break a
`fullgraph` compile. So the ops the model layers call — norm, rotary, activation, the
linear layers' matmul, the int8 quant ops — are registered here with a schema and a fake
(shape-only) implementation: Dynamo records one call per op, as it does for torch_npu's,
and the call runs the simulated op at run time.

Outside a compile the wrapper calls the simulated op directly (no dispatcher round trip
in eager forwards and FULL-graph capture). Inside a simulated graph capture the recorder
opens the custom op (graph.py `_is_opaque`), so the op-surface call under it is recorded
as it is in eager capture. vLLM's attention and MoE ops are vLLM's own custom ops already.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

_LIB = torch.library.Library("npu_sim", "FRAGMENT")  # kept alive: owns the registrations
NAMESPACE = "npu_sim"


def _rms_norm_fake(x, gamma, epsilon=1e-6):
    keep = x.shape[:x.dim() - gamma.dim()] + (1,) * gamma.dim()
    return torch.empty_like(x), x.new_empty(keep, dtype=torch.float32)


def _add_rms_norm_fake(x1, x2, gamma, epsilon=1e-6):
    y, rstd = _rms_norm_fake(x1, gamma, epsilon)
    return y, rstd, torch.empty_like(x1)


def _swiglu_fake(x, dim=-1):
    shape = list(x.shape)
    shape[dim] //= 2
    return x.new_empty(shape)


def _linear_fake(x, weight, bias=None):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _quant_matmul_fake(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                       output_dtype=None):
    return x1.new_empty(*x1.shape[:-1], x2.shape[1], dtype=output_dtype or torch.int8)


# name -> (schema, fake); the schemas follow the simulated ops' Python signatures, which
# follow torch_npu's (`torch_npu/_op_plugin_docs.py`)
_OPS: dict[str, tuple[str, Callable]] = {
    "npu_rms_norm": ("(Tensor x, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
                     _rms_norm_fake),
    "npu_add_rms_norm": ("(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> "
                         "(Tensor, Tensor, Tensor)", _add_rms_norm_fake),
    "npu_rotary_mul": ("(Tensor x, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor",
                       lambda x, r1, r2, rotary_mode="half": torch.empty_like(x)),
    "npu_swiglu": ("(Tensor x, int dim=-1) -> Tensor", _swiglu_fake),
    "device_matmul": ("(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor", _linear_fake),
    "npu_quantize": ("(Tensor input, Tensor scales, Tensor? zero_points, ScalarType dtype, "
                     "int axis=1, bool div_mode=True) -> Tensor",
                     lambda input, *a, **k: input.new_empty(input.shape, dtype=torch.int8)),
    "npu_dynamic_quant": ("(Tensor input, *, Tensor? smooth_scales=None, "
                          "Tensor? group_index=None, ScalarType? dst_type=None) -> "
                          "(Tensor, Tensor)",
                          lambda input, **k: (input.new_empty(input.shape, dtype=torch.int8),
                                              input.new_empty(input.shape[:-1],
                                                              dtype=torch.float32))),
    "npu_quant_matmul": ("(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
                         "Tensor? pertoken_scale=None, Tensor? bias=None, "
                         "ScalarType? output_dtype=None) -> Tensor", _quant_matmul_fake),
}


def opaque(name: str, fn: Callable) -> Callable:
    """`fn` (a simulated op) registered as `torch.ops.npu_sim.<name>`; returns the function
    the surface exports: the custom op while Dynamo traces, `fn` itself otherwise."""
    schema, fake = _OPS[name]
    _LIB.define(name + schema)
    _LIB.impl(name, fn, "CPU")
    _LIB._register_fake(name, fake)
    op = getattr(getattr(torch.ops, NAMESPACE), name)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return op(*args, **kwargs)
        return fn(*args, **kwargs)

    call.opaque_op = op
    return call
