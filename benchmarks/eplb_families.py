"""Thin wrapper: ``python benchmarks/eplb_families.py [...]`` is
``python -m vllm_npu.eplb.bench_families`` (EPLB policies on drifting workload families,
optionally against vllm-ascend's own policies with ``--vllm-ascend``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_npu.eplb.bench_families import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
