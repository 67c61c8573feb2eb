"""Thin wrapper: ``python benchmarks/eplb_policies.py [--quick]`` is
``python -m vllm_npu.eplb.bench``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_npu.eplb.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
