"""Mixture-of-experts on the NPU: routing, expert placement, expert parallelism."""
