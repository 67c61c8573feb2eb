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
    """The dtype engines are checked against HF in (tests/helpers/reference.parity_dtype):
    float32 on the simulated NPU, where parity is token-exact; the device's bfloat16 on a
    device, where hf_greedy's reference runs in bfloat16 and accepts a divergence at a near
    tie. VLLM_NPU_TEST_DTYPE=bfloat16 runs the device's way on the simulator."""
    from tests.helpers.reference import parity_dtype as dtype

    if dtype() == "float32" and not simulated:
        pytest.fail("VLLM_NPU_TEST_DTYPE=float32: devices take bfloat16 / float16 only")
    return dtype()


@pytest.fixture(scope="session")
def float32_only(parity_dtype) -> str:
    """For checks of float32-exact values (logprobs to 1e-4, router counts, byte counts,
    float32 fake-quant references, statistics against float32 probabilities): skipped
    where the parity dtype is another."""
    if parity_dtype != "float32":
        pytest.skip(f"checks float32-exact values; the parity dtype here is {parity_dtype}")
    return parity_dtype


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
