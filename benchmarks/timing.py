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


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the population `values` were drawn
    from: the order statistics [x_(k), x_(n+1-k)], which cover it with probability
    1 - 2 P(Binomial(n, 1/2) <= k - 1), for the largest k whose coverage still reaches
    `confidence` (k = 1, the whole range, where none does). Returns (low, high, coverage).
    Makes no assumption on the ratios' distribution, which on a shared host is skewed by
    whichever side a burst of load hits."""
    from scipy.stats import binom  # lazily: the peer's venv imports this module too

    xs, n = sorted(values), len(values)
    if not n:
        raise ValueError("median_interval needs at least one value")
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * binom.cdf(k, n, 0.5) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k], float(1 - 2 * binom.cdf(k - 1, n, 0.5))


def sign_test_above(values: list[float], level: float = 1.0) -> tuple[int, int, float]:
    """How many of `values` lie above `level`, of those not equal to it, and the one-sided
    sign test's p-value for "the median lies above `level`" (scipy's exact binomial test)."""
    from scipy.stats import binomtest

    above = sum(v > level for v in values)
    counted = sum(v != level for v in values)
    p = binomtest(above, counted, 0.5, alternative="greater").pvalue if counted else 1.0
    return above, counted, float(p)
