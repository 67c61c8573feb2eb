"""Shared timing helpers for the benchmark scripts."""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable


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


def timed(fn: Callable[..., Any], record: Callable[[float], None]) -> Callable[..., Any]:
    """`fn`, calling `record(seconds)` after each call (a raising one too): how the engine
    benchmarks time vLLM's methods in place, on both the plugin's and the peer's side."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(time.perf_counter() - t0)
    return call
