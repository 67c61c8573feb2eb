"""Every architecture in the registry (architectures.py) serves HF transformers' greedy
tokens on the simulated NPU, in each graph mode listed and with TP=2 (EP for MoE) in
FULL_AND_PIECEWISE: tiny random-weight models of shapes chosen here, float32, HF's eager
attention as the reference. Engines keep vLLM's default settings (batch sizes, block size,
capture sizes, chunked prefill, prefix caching) but the context length and the KV cache
size (64 blocks, hybrids 272: the simulated NPU's default 4 GB per device would be host
memory here)."""
from __future__ import annotations

import functools
import os

import pytest

from tests.e2e.architectures import ARCHS, models_table
from tests.helpers.engine import vocab
from tests.helpers.engine_host import generate_once
from tests.helpers.reference import hf_greedy, random_prompt

MAX_TOKENS = 12
README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


@pytest.fixture(scope="module")
def arch_root(tmp_path_factory):
    return tmp_path_factory.mktemp("archs")


@functools.cache
def _build(root: str, name: str) -> str:
    from vllm_npu.testing import tiny_archs, tiny_model

    arch = ARCHS[name]
    path = os.path.join(root, f"tiny-{arch.tiny}")
    if arch.tiny in tiny_archs.ARCHS:
        return tiny_archs.build_tiny_arch(path, arch.tiny)
    return tiny_model.build_tiny_model(path, arch.tiny)


def _prompts(name: str, path: str) -> list[list[int]]:
    base = ARCHS[name].prompt_len
    return [random_prompt(100 + i, base + 23 * i, vocab(path)) for i in range(4)]


@functools.cache
def _reference(path: str, name: str, overrides: tuple = ()) -> list[list[int]]:
    # eager attention: HF's SDPA path drops Gemma 2's soft cap
    return [hf_greedy(path, p, MAX_TOKENS, attn_implementation="eager", **dict(overrides))
            for p in _prompts(name, path)]


def _cases():
    for name, arch in ARCHS.items():
        for mode in arch.modes:
            yield pytest.param(name, mode, 1, id=f"{name}-{mode}")
        if arch.parallel:
            yield pytest.param(name, "FULL_AND_PIECEWISE", 2, id=f"{name}-{arch.parallel}")


@pytest.mark.parametrize("name,mode,tp", list(_cases()))
def test_architecture_gives_hf_tokens(arch_root, parity_dtype, engine_host, name, mode, tp):
    arch = ARCHS[name]
    path = _build(str(arch_root), name)
    want = _reference(path, name)
    kwargs = dict(dtype=parity_dtype, max_model_len=512, seed=0,
                  num_gpu_blocks_override=arch.blocks,
                  compilation_config={"cudagraph_mode": mode})
    if tp > 1:  # workers fork from the engine host (tests/helpers/engine_host.py)
        got = engine_host.generate(path, _prompts(name, path), MAX_TOKENS,
                                   tensor_parallel_size=tp, distributed_executor_backend="mp",
                                   enable_expert_parallel=arch.moe, **kwargs)
    else:
        got = generate_once(path, _prompts(name, path), MAX_TOKENS, **kwargs)
    assert got == want


@pytest.mark.parametrize("name", [n for n, a in ARCHS.items() if a.proof])
def test_each_feature_changes_the_reference(arch_root, name):
    """Without the feature (soft cap, window, chunk) HF gives other tokens: matching HF
    means the NPU path applied it."""
    path = _build(str(arch_root), name)
    for key, value in ARCHS[name].proof:
        assert _reference(path, name, ((key, value),)) != _reference(path, name), key


def test_readme_models_table_is_the_tested_set():
    with open(README) as f:
        readme = f.read()
    assert models_table() in readme, "README's models table differs from " \
        "tests/e2e/architectures.py: paste `python -m tests.e2e.architectures`"
