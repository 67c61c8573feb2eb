"""The simulated ops compiled code calls are opaque custom ops for Dynamo: a `fullgraph`
compile records them (it never traces their Python), their fakes give the shapes and
dtypes the ops return, and the compiled function computes what plain PyTorch does."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu.ops import sim
from vllm_npu.ops.sim.linear import ONEDNN_MIN_ROWS
from vllm_npu.ops.sim.opaque import _OPS


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _cases():
    g = _gen()
    x = torch.randn(6, 64, generator=g)
    gamma = torch.rand(64, generator=g) + 0.5
    rope_x = torch.randn(1, 6, 2, 32, generator=g)
    cos, sin = torch.randn(2, 1, 6, 1, 32, generator=g)
    int8 = torch.randint(-127, 128, (6, 64), generator=g, dtype=torch.int8)
    w_int8 = torch.randint(-127, 128, (64, 48), generator=g, dtype=torch.int8)
    return {
        "npu_rms_norm": ((x, gamma, 1e-6), {}),
        "npu_add_rms_norm": ((x, x.flip(0), gamma, 1e-6), {}),
        "npu_rotary_mul": ((rope_x, cos, sin, "half"), {}),
        "npu_swiglu": ((x,), {"dim": -1}),
        "device_matmul": ((x, torch.randn(48, 64, generator=g), None), {}),
        "npu_quantize": ((x, torch.tensor([0.05]), None, torch.qint8, -1, True), {}),
        "npu_dynamic_quant": ((x,), {}),
        "npu_quant_matmul": ((int8, w_int8, torch.full((48,), 1e-3)),
                             {"output_dtype": torch.float32}),
    }


def test_every_opaque_op_has_a_case():
    assert set(_cases()) == set(_OPS)


@pytest.mark.parametrize("name", sorted(_OPS))
def test_fake_matches_the_simulated_op(name):
    args, kwargs = _cases()[name]
    real = getattr(sim, name)(*args, **kwargs)
    fake = _OPS[name][1](*args, **kwargs)
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


def _layer(x, gamma, w_up, w_down):
    """norm -> up projection -> swiglu -> down projection -> residual norm."""
    h = sim.npu_rms_norm(x, gamma, 1e-6)[0]
    h = sim.npu_swiglu(sim.device_matmul(h, w_up, None), dim=-1)
    h = sim.device_matmul(h, w_down, None)
    return sim.npu_add_rms_norm(h, x, gamma, 1e-6)[0]


def _reference(x, gamma, w_up, w_down):
    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma

    a, b = F.linear(rms(x), w_up).chunk(2, dim=-1)
    return rms(F.linear(F.silu(a) * b, w_down) + x)


@pytest.mark.parametrize("rows", [8, ONEDNN_MIN_ROWS + 8])  # decode and prefill matmuls
def test_fullgraph_compile_records_the_ops_and_matches_pytorch(rows):
    g = _gen()
    x = torch.randn(rows, 64, generator=g)
    gamma = torch.rand(64, generator=g) + 0.5
    w_up, w_down = torch.randn(256, 64, generator=g) / 8, torch.randn(64, 128, generator=g) / 8
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(_layer, fullgraph=True, backend=backend)
    out = compiled(x, gamma, w_up, w_down)
    torch.testing.assert_close(out, _reference(x, gamma, w_up, w_down), atol=1e-4, rtol=1e-4)
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls == ["npu_sim.npu_rms_norm", "<built-in function getitem>",
                     "npu_sim.device_matmul", "npu_sim.npu_swiglu",
                     "npu_sim.device_matmul", "npu_sim.npu_add_rms_norm",
                     "<built-in function getitem>"]
