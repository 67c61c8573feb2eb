"""``python benchmarks/eplb_families.py [--seeds report|tuning] [--vllm-ascend]``: the EPLB
policies on drifting workload families, optionally against vllm-ascend's own policies
(benchmarks/eplb/bench_families.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eplb.bench_families import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
