"""Shared timing helper for the benchmark scripts."""
from __future__ import annotations

import statistics
import time


def median_ms(fn, iters: int, warmup: int = 0) -> float:
    """Median wall time of `fn()` in milliseconds over `iters` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)
