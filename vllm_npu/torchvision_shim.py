"""torchvision beside CPU torch on the simulated NPU's stack (a simulated-stack measure).

The torchvision wheels this stack can install are PyPI's, whose C++ extension (`_C.so`)
links CUDA torch (`libc10_cuda.so`); beside torch+cpu it does not load, and torchvision
0.28's `_meta_registrations.py` then fails at import registering fake kernels for two ops
the extension would have defined: `RuntimeError: operator torchvision::nms does not exist`.
Every vLLM 0.33 vision-language model (and Qwen3.5, whose module imports the VL code)
imports torchvision, as do HF's fast image processors.

`tools/install.sh` writes a `.pth` file that calls `install()` in each interpreter of the
venv, only where `import torchvision` fails that way. `install()` adds an import hook (it
imports nothing itself); when torchvision is first imported, the hook tries to load its
extension and, only if that fails, defines the two ops' schemas:

    op                      here                               torchvision's C++ (CPU)
    torchvision::nms        a pure-PyTorch kernel (greedy NMS) csrc/ops/cpu/nms_kernel.cpp
    torchvision::qnms       raises NotImplementedError         csrc/ops/quantized/cpu/qnms_kernel.cpp

Everything else keeps torchvision's own behaviour without its extension: `ops.roi_align`
runs its pure-Python path (`torchvision/ops/roi_align.py::_roi_align`), `ops.nms` and the
other ops raise torchvision's "Couldn't load custom C++ ops" RuntimeError, and
`torchvision.io`'s image decoders are absent (vLLM and HF decode images with Pillow).
On an Ascend host none of this is installed: torch_npu's stack takes CPU torch with its
matching CPU torchvision from PyTorch's own index.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_LIBRARIES = []  # the torch.library.Library objects: their ops live as long as these do
NMS_SCHEMA = "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
QNMS_SCHEMA = "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def nms(dets, scores, iou_threshold: float):
    """Indices of the boxes kept, by decreasing score: each kept box suppresses the later
    ones whose IoU with it exceeds `iou_threshold` (boxes as x1, y1, x2, y2), as
    torchvision's CPU kernel does."""
    import torch

    torch._check(dets.dim() == 2 and dets.size(1) == 4,
                 lambda: f"boxes should be a [N, 4] tensor, got {tuple(dets.shape)}")
    torch._check(scores.dim() == 1 and scores.size(0) == dets.size(0),
                 lambda: f"scores should be a [{dets.size(0)}] tensor, got {tuple(scores.shape)}")
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.sort(dim=0, descending=True, stable=True).indices
    suppressed = torch.zeros(dets.size(0), dtype=torch.bool, device=dets.device)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.long, device=dets.device)


def _qnms(dets, scores, iou_threshold: float):
    raise NotImplementedError(
        "torchvision::qnms (NMS on quantized boxes) is not available on the simulated NPU's "
        "stack: torchvision's C++ extension does not load beside CPU torch "
        "(vllm_npu.torchvision_shim); dequantize the boxes and call torchvision::nms")


def define_ops() -> None:
    """Define the ops torchvision's import needs, unless its extension defined them."""
    import torch

    if hasattr(torch.ops.torchvision, "nms"):
        return
    lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 (kept alive below)
    lib.define(NMS_SCHEMA)
    lib.define(QNMS_SCHEMA)
    lib.impl("nms", nms, "CPU")
    lib.impl("qnms", _qnms, "CPU")
    _LIBRARIES.append(lib)


def _extension_loads(spec) -> bool:
    import glob
    import os

    import torch

    for path in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(path)
            return True
        except OSError:
            return False
    return False


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs once, as torchvision is first imported; lets the normal finders import it."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is not None and spec.origin and not _extension_loads(spec):
            define_ops()
        return None


def install() -> None:
    """Called from the venv's .pth file at interpreter start: cheap, imports nothing."""
    if "torchvision" not in sys.modules and not any(
            isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
