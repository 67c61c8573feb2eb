"""Reading a disaggregated deployment's state from its instances' Prometheus metrics."""
from __future__ import annotations

import time

import pytest

from vllm_npu.disagg.instance_state import load as busy
from vllm_npu.disagg.instance_state import metric_sum, scrape


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples whose labels include `labels`."""
    return metric_sum(scrape(url), name, **labels)


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
