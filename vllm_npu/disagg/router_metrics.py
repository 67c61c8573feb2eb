"""The router's own Prometheus metrics (GET /metrics), in a registry of their own so that
two routers in one process (tests) do not collide and vLLM's collectors stay out."""
from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

# What became of a request at the router; the label values of `requests_total`.
OUTCOMES = ("ok", "upstream_error", "prefill_failed", "decode_failed", "timeout",
            "client_disconnected", "bad_request", "unavailable")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "vllm_npu_router_requests", "Requests the router finished, by endpoint and "
            "outcome", ["endpoint", "outcome"], registry=r)
        self.in_flight = Gauge(
            "vllm_npu_router_requests_in_flight", "Requests between arrival and their "
            "last byte", registry=r)
        self.latency = Histogram(
            "vllm_npu_router_request_seconds", "Arrival to last byte", ["endpoint"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.first_byte = Histogram(
            "vllm_npu_router_first_byte_seconds", "Arrival to the decode instance's first "
            "byte (time to first token for a stream)", ["endpoint"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.prefill = Histogram(
            "vllm_npu_router_prefill_seconds", "The prefill half: sent to answered",
            ["instance"], buckets=_LATENCY_BUCKETS, registry=r)
        self.up = Gauge(
            "vllm_npu_router_instance_up", "1 while the instance answers /health",
            ["role", "instance"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
