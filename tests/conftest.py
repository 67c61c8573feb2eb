"""Shared fixtures: tiny local models (no hub) and the backend the tests run on."""
from __future__ import annotations

import os
from pathlib import Path

# Offline LLM tests run the engine in-process: much faster to start, same code paths.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Every connection the tests make (process groups, engine message queues) stays on loopback.
os.environ["VLLM_HOST_IP"] = "127.0.0.1"

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_model import ARCHS, build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {arch: build_tiny_model(str(root / f"tiny-{arch}"), arch=arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def simulated() -> bool:
    from vllm_npu.device import select_backend

    return select_backend().simulated


@pytest.fixture(scope="session")
def parity_dtype(simulated) -> str:
    """Token-exact parity with HF needs float32, which only the simulated NPU runs."""
    if not simulated:
        pytest.skip("float32 parity runs on the simulated NPU; devices take fp16/bf16 only")
    return "float32"


@pytest.fixture
def single_torch_thread():
    """Tiny-shape CPU tests run torch single-threaded: intra-op threads buy nothing there,
    and on a busy 2-core machine contending OpenMP workers make each op ~10x slower.
    The previous thread count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Small-shape unit tests of ops, layers and attention backends run single-threaded.
SINGLE_THREAD_DIRS = {"ops", "layers", "attention"}


@pytest.fixture(autouse=True)
def _small_shapes_single_threaded(request):
    top = Path(request.node.path).relative_to(Path(__file__).parent).parts[0]
    if top in SINGLE_THREAD_DIRS:
        request.getfixturevalue("single_torch_thread")
    yield
