"""The versions that matter to the plugin, the one startup line that reports them, and the
supported combinations (the README's compatibility table; a test keeps the two equal).

    vllm_npu 0.1.0 on the simulated NPU: vLLM 0.33.0, torch 2.13.0+cpu, torch_npu -, CANN -

A combination outside SUPPORTED is logged as a warning, not refused: a newer patch release
may well work, and the user should know it was not tested.
"""
from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import platform
import re
from dataclasses import dataclass

logger = logging.getLogger("vllm.npu")


@dataclass(frozen=True)
class Combination:
    device: str          # "simulated NPU" or "Ascend NPU"
    vllm: str            # exact release
    torch: str           # major.minor
    torch_npu: str | None  # major.minor (matches torch), None: not used
    cann: str            # what the CANN column says (not checked: torch_npu checks it)


SUPPORTED = (
    Combination("simulated NPU", "0.33.0", "2.13", None, "-"),
    Combination("Ascend NPU", "0.33.0", "2.14", "2.14", "the release torch_npu 2.14 requires"),
)


@dataclass(frozen=True)
class Versions:
    vllm_npu: str
    vllm: str | None
    torch: str | None
    torch_npu: str | None
    cann: str | None

    def line(self, device: str) -> str:
        return (f"vllm_npu {self.vllm_npu} on the {device}: vLLM {self.vllm or '-'}, torch "
                f"{self.torch or '-'}, torch_npu {self.torch_npu or '-'}, CANN "
                f"{self.cann or '-'}")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cann_version(roots: list[str] | None = None) -> str | None:
    """CANN's toolkit version from its install record (`<toolkit>/<arch>-linux/
    ascend_toolkit_install.info`, as vllm-ascend's collect_env reads it), None where CANN
    is absent."""
    if roots is None:
        roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
        roots.append("/usr/local/Ascend/ascend-toolkit/latest")
    for root in filter(None, roots):
        path = os.path.join(root, f"{platform.machine()}-linux", "ascend_toolkit_install.info")
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("version="):
                        return line.split("=", 1)[1].strip()
        except OSError:
            continue
    return None


def installed() -> Versions:
    return Versions(_version("vllm_npu") or "unknown", _version("vllm"), _version("torch"),
                    _version("torch_npu"), cann_version())


def _major_minor(version: str | None) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m[1]}.{m[2]}" if m else None


def problems(v: Versions, device: str) -> list[str]:
    """Why `v` on `device` is outside SUPPORTED (empty when it is supported)."""
    rows = [c for c in SUPPORTED if c.device == device]
    if not rows:
        return [f"no supported combination for the {device}"]
    want = rows[0]
    out = []
    if (v.vllm or "").split("+")[0] != want.vllm:
        out.append(f"vLLM {v.vllm} (supported: {want.vllm})")
    if _major_minor(v.torch) != want.torch:
        out.append(f"torch {v.torch} (supported: {want.torch}.x)")
    if want.torch_npu is not None and _major_minor(v.torch_npu) != want.torch_npu:
        out.append(f"torch_npu {v.torch_npu} (supported: {want.torch_npu}.x)")
    return out


@functools.cache
def log_versions(device: str) -> None:
    """The startup line, and a warning for a combination outside the README's table."""
    v = installed()
    logger.info("%s", v.line(device))
    bad = problems(v, device)
    if bad:
        logger.warning("vllm_npu: untested combination on the %s: %s; see the compatibility "
                       "table in the README", device, "; ".join(bad))
