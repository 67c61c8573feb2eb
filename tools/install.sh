#!/usr/bin/env bash
# Create .venv with vLLM 0.33.0 built without CUDA kernels, CPU torch, and this
# package in editable mode. Idempotent: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
VLLM_VERSION=0.33.0

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # torch 2.13.0+cpu lies in pip's find-links on CI machines; on an NPU host
  # install torch 2.14 + torch_npu 2.14 by hand before running this script.
  $PIP install -q "torch==2.13.0"
fi
$PIP install -q "setuptools>=77.0.3,<81" setuptools-rust "setuptools-scm>=8" wheel packaging jinja2

if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm').split('+')[0] != '$VLLM_VERSION')" 2>/dev/null; then
  sdist=$("$VENV/bin/python" tools/fetch_sdist.py vllm "$VLLM_VERSION" build/sdist)
  VLLM_TARGET_DEVICE=empty $PIP install -q --no-build-isolation "$sdist"
fi

# The package, editable; its build step (setup.py) also compiles the CPU HCCL simulator
# csrc/ -> vllm_npu/distributed/libhccl_sim.so, the same way a wheel gets it.
$PIP install -q --no-build-isolation -e ".[test,pd,bench]"
"$VENV/bin/python" -c "from vllm_npu.distributed.hccl_library import SIMULATOR_PATH as p; \
import sys; sys.exit(0 if p.is_file() else 1)" || echo "install.sh: the HCCL simulator \
was not built (no C compiler?): the single-device simulated NPU works; TP/PP/DP on the \
simulated NPU need gcc and a rerun" >&2

# Mooncake's pip wheels link libibverbs even for TCP transfers (PD disaggregation).
if ! "$VENV/bin/python" -c "import mooncake.engine" 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install.sh: installing libibverbs1 (the Mooncake transfer engine links it)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null; }
  fi
  "$VENV/bin/python" -c "import mooncake.engine" 2>/dev/null || echo "install.sh: the \
Mooncake transfer engine does not import (missing libibverbs.so.1? apt-get install \
libibverbs1): prefill/decode disaggregation will not start" >&2
fi

# torchvision, which vLLM's vision-language models (and Qwen3.5) import. On an NPU host the
# image's CPU torchvision from PyTorch's index imports as it is. Here the only wheels are
# PyPI's, whose C++ extension links CUDA torch: installed without dependencies (torch stays
# as it is), at the release that matches torch (2.M.P -> 0.(M+15).P), and where it then
# fails to import, a .pth file defines the ops its import needs (vllm_npu/torchvision_shim.py).
if ! "$VENV/bin/python" -c "import torchvision" 2>/dev/null; then
  tv=$("$VENV/bin/python" -c "import torch; M, P = torch.__version__.split('+')[0].split('.')[1:3]; \
print(f'0.{int(M) + 15}.{P}')")
  $PIP install -q --no-deps "torchvision==$tv"
  err=$("$VENV/bin/python" -c "import torchvision" 2>&1 || true)
  if [[ "$err" == *"operator torchvision::nms does not exist"* ]]; then
    site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # (a no-op once vllm_npu is uninstalled)
    echo 'import importlib.util as u; u.find_spec("vllm_npu") and __import__("vllm_npu.torchvision_shim").torchvision_shim.install()' \
      > "$site/vllm_npu_torchvision.pth"
  fi
  "$VENV/bin/python" -c "import torchvision" || echo "install.sh: torchvision $tv does not \
import beside torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'): \
vision-language models will not load" >&2
fi
