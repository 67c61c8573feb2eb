"""The CustomOp OOT layers (RMSNorm with and without the fused residual add, rotary
embedding incl. partial rotary and both rotary styles, SiluAndMul) against vLLM's own
native implementations of the same layers. Engines use them where vLLM runs custom ops:
see tests/e2e/test_graph_modes.py for which graph modes that is."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.layers.activation import NPUSiluAndMul
from vllm_npu.layers.layernorm import NPURMSNorm
from vllm_npu.layers.rotary_embedding import NPURotaryEmbedding


@pytest.fixture(autouse=True)
def vllm_config():
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(
            compilation_config=CompilationConfig(custom_ops=["all"]))):
        yield


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_layer_matches_vllm_native(with_residual):
    layer = NPURMSNorm(64, eps=1e-5)
    layer.weight.data.copy_(_randn(64, seed=1) + 1)
    x = _randn(7, 64, seed=2)
    residual = _randn(7, 64, seed=3) if with_residual else None
    got = layer.forward_oot(x.clone(), None if residual is None else residual.clone())
    want = layer.forward_native(x.clone(), None if residual is None else residual.clone())
    if with_residual:
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)  # x + residual
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32, 16])  # full, half, quarter of the head
def test_rotary_layer_matches_vllm_native(neox, rotary_dim):
    head, heads, kv_heads, tokens = 64, 4, 2, 9
    layer = NPURotaryEmbedding(head, rotary_dim, 256, 10000.0, neox, torch.float32)
    positions = torch.tensor([0, 1, 2, 17, 40, 41, 100, 200, 255])
    q = _randn(tokens, heads * head, seed=4)
    k = _randn(tokens, kv_heads * head, seed=5)
    got_q, got_k = layer.forward_oot(positions, q.clone(), k.clone())
    want_q, want_k = layer.forward_native(positions, q.clone(), k.clone())
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)
    if rotary_dim < head:  # the features past rotary_dim pass through untouched
        tail = q.view(tokens, heads, head)[..., rotary_dim:]
        assert torch.equal(got_q.view(tokens, heads, head)[..., rotary_dim:], tail)


def test_rotary_rows_are_gathered_once_per_forward(mocker):
    """Layers sharing the rope instance (vLLM's get_rope) reuse the first layer's cos/sin
    rows within one forward; the next forward, with new positions written into the same
    buffer, gathers again and matches vLLM's native rotary."""
    from vllm.forward_context import set_forward_context

    layer = NPURotaryEmbedding(32, 32, 256, 10000.0, True, torch.float32)
    positions = torch.tensor([3, 4, 5])
    q, k = _randn(3, 2 * 32, seed=7), _randn(3, 32, seed=8)
    gather = mocker.spy(layer, "_gather_cos_sin")
    for step in range(2):
        if step:
            positions.add_(50)  # the next step's positions, in place
        with set_forward_context(None, layer_vllm_config()):
            outs = [layer.forward_oot(positions, q.clone(), k.clone()) for _ in range(3)]
        assert gather.call_count == step + 1
        want_q, want_k = layer.forward_native(positions, q.clone(), k.clone())
        for got_q, got_k in outs:
            torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)
    with set_forward_context(None, layer_vllm_config()):  # a new forward, same positions
        layer.forward_oot(positions, q.clone(), k.clone())
    assert gather.call_count == 3


def layer_vllm_config():
    from vllm.config import get_current_vllm_config

    return get_current_vllm_config()


def test_silu_and_mul_layer_matches_vllm_native():
    layer = NPUSiluAndMul()
    x = _randn(5, 2 * 48, seed=6)
    torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("custom_ops, norm_on, act_on", [
    (["all", "-rms_norm"], False, True),
    (["none", "+silu_and_mul"], False, True),
    (["all"], True, True),
])
def test_per_op_switches_reach_the_npu_ops(custom_ops, norm_on, act_on):
    """`--compilation-config '{"custom_ops": ["-rms_norm"]}'` turns the NPU's RMSNorm off
    as it turns vLLM's in-tree one off (vLLM's register_oot names an OOT op after the
    in-tree class, which the switches never name)."""
    from vllm.config import (CompilationConfig, VllmConfig, get_cached_compilation_config,
                             set_current_vllm_config)
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=list(custom_ops)))
    get_cached_compilation_config.cache_clear()
    with set_current_vllm_config(config):
        norm, act = RMSNorm(64), SiluAndMul()
        assert (type(norm), type(act)) == (NPURMSNorm, NPUSiluAndMul)
        assert (norm.enabled(), act.enabled()) == (norm_on, act_on)
    get_cached_compilation_config.cache_clear()
