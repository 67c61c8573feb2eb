"""CustomOp out-of-tree layers: vLLM's norm / rotary / activation through the NPU op surface."""
from __future__ import annotations


def replaces(base):
    """`@replaces(RMSNorm)`: the NPU class is `base`'s out-of-tree op, under `base`'s op
    name. vLLM's `CustomOp.register_oot` names it after the class ("RMSNorm"), while
    `enabled()` looks the op name up in `--compilation-config custom_ops` ("-rms_norm"):
    without the name the per-op switches would never reach the NPU's ops."""
    def register(cls):
        base.register_oot(cls)
        cls.name = base.name
        return cls
    return register
