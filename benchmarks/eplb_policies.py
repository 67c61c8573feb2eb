"""``python benchmarks/eplb_policies.py [--quick]``: the EPLB policies on a grid of ranks,
redundant slots and drift presets (benchmarks/eplb/bench.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eplb.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
