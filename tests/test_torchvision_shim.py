"""torchvision beside CPU torch (vllm_npu/torchvision_shim.py, installed by tools/install.sh):
which of its C++ ops are real here and which raise."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from vllm_npu.torchvision_shim import nms


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _reference_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    """Greedy NMS over plain floats: every box, best score first, kept unless it overlaps a
    kept box by more than `threshold`."""
    rows = boxes.tolist()
    kept: list[int] = []
    for i in sorted(range(len(rows)), key=lambda k: -scores[k].item()):
        if all(_iou(rows[i], rows[j]) <= threshold for j in kept):
            kept.append(i)
    return kept


def _boxes(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 50
    wh = torch.rand(n, 2, generator=g) * 20 + 1
    return torch.cat([xy, xy + wh], 1), torch.randperm(n, generator=g).float() / n


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("seed", range(4))
def test_nms_matches_greedy_reference(seed, threshold):
    boxes, scores = _boxes(seed, 60)
    assert nms(boxes, scores, threshold).tolist() == _reference_nms(boxes, scores, threshold)


def test_nms_of_no_boxes_and_bad_shapes():
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).tolist() == []
    with pytest.raises(RuntimeError, match=r"boxes should be a \[N, 4\] tensor, got \(3, 5\)"):
        nms(torch.zeros(3, 5), torch.zeros(3), 0.5)
    with pytest.raises(RuntimeError, match=r"scores should be a \[3\] tensor, got \(2,\)"):
        nms(torch.zeros(3, 4), torch.zeros(2), 0.5)


@pytest.fixture
def torchvision(simulated):
    """torchvision whose C++ extension did not load, as make install leaves it beside CPU
    torch (on the simulated NPU it must import)."""
    if not simulated:
        pytest.importorskip("torchvision")
    import torchvision

    if torchvision.extension._has_ops():
        pytest.skip("torchvision's own C++ extension loaded (a device's stack)")
    return torchvision


def test_which_ops_are_real_beside_cpu_torch(torchvision):
    boxes, scores = _boxes(9, 40)
    # The op the shim defines runs its pure-PyTorch kernel.
    assert torch.ops.torchvision.nms(boxes, scores, 0.4).tolist() == _reference_nms(
        boxes, scores, 0.4)
    # The transforms HF's fast image processors and vLLM's VL processors use: pure torch.
    from torchvision.transforms.v2 import functional as F

    image = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)
    assert torch.equal(F.resize(image, [2, 3], antialias=False),
                       torch.nn.functional.interpolate(image[None], size=(2, 3), mode="bilinear",
                                                     align_corners=False)[0])
    # What stays out raises, naming the cause.
    with pytest.raises(RuntimeError, match="Couldn't load custom C\\+\\+ ops"):
        torchvision.ops.nms(boxes, scores, 0.4)
    with pytest.raises(NotImplementedError, match="torchvision::qnms .* simulated NPU"):
        torch.ops.torchvision.qnms(boxes, scores, 0.4)


def test_the_venv_hook_imports_nothing_until_torchvision_is_imported(torchvision):
    code = ("import sys; before = 'torch' in sys.modules; import torchvision; "
            "print(before, torchvision.__version__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[0] == "False"
