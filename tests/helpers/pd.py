"""Reading a disaggregated deployment's state from its instances' Prometheus metrics."""
from __future__ import annotations

import re
import time

import pytest
import requests


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples whose labels include `labels`."""
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        m = re.match(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def busy(url: str) -> tuple[float, float, float]:
    """(KV cache usage, running, waiting) of one vLLM instance."""
    return (metric(url, "vllm:kv_cache_usage_perc"), metric(url, "vllm:num_requests_running"),
            metric(url, "vllm:num_requests_waiting"))


def wait_idle(urls: list[str], timeout_s: float = 60) -> float:
    """Wait until every instance has no running or waiting request and no KV block in use
    (blocks a prefill instance holds for a pull are freed once the decode side has pulled
    them); return the seconds it took."""
    t0 = time.time()
    while True:
        state = {u: busy(u) for u in urls}
        if all(v == (0.0, 0.0, 0.0) for v in state.values()):
            return time.time() - t0
        if time.time() - t0 > timeout_s:
            pytest.fail(f"instances still hold blocks/requests after {timeout_s} s: {state}")
        time.sleep(0.5)
