"""A vLLM instance's state as its Prometheus endpoint reports it (the router's health view,
tests and the soak read instances the way an operator's monitoring does)."""
from __future__ import annotations

import re

import requests


def scrape(url: str, timeout_s: float = 30) -> str:
    return requests.get(f"{url}/metrics", timeout=timeout_s).text


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (in a scrape's `text`) whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def load(url: str, timeout_s: float = 30) -> tuple[float, float, float]:
    """(KV cache usage, running, waiting) of one vLLM instance, from one scrape."""
    text = scrape(url, timeout_s)
    return tuple(metric_sum(text, n) for n in (  # type: ignore[return-value]
        "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"))
