"""Helpers shared by the tests, `make serve` and the benchmarks (no hub access needed)."""
