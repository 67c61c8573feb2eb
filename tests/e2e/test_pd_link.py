"""Prefill/decode disaggregation over a slow, lossy link: the prefill instance on one simulated
host, the decode instance and the router on another (network namespaces joined by a veth
pair, addresses that exist only inside them), the link shaped with a token bucket on both
ends. Concurrent requests must give HF's greedy tokens, the KV must cross that link (its
bytes counted by the qdisc), the bucket must have dropped packets (TCP resent them), and
every instance must be idle afterwards.

This kernel has no netem (`tc qdisc ... netem` -> "Specified qdisc kind is unknown") and no
tc classifiers or actions; `tbf` is what there is: it paces what leaves at RATE and drops
what overflows its small queue, so a burst of KV writes loses packets as a congested link
does.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.engine import vocab
from tests.helpers.ray_nodes import REPO, Hosts, netns_available
from tests.helpers.reference import hf_greedy, random_prompt

pytestmark = pytest.mark.skipif(not netns_available(),
                                reason="needs root and network namespaces")
RATE_BIT_S = 8_000_000
TBF = ["tbf", "rate", "8mbit", "burst", "16kb", "limit", "32kb"]
TOKENS = 8


def _tc(netns: str, *args: str) -> str:
    res = subprocess.run(["ip", "netns", "exec", netns, "tc", *args], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_pd_over_a_slow_lossy_link(tiny_models, parity_dtype, tmp_path):
    path = tiny_models["llama"]
    prompts = [random_prompt(300 + i, 150 + 50 * i, vocab(path)) for i in range(8)]
    with Hosts(2) as hosts:
        prefill, decode = hosts.nodes
        for node in hosts.nodes:
            _tc(node.netns, "qdisc", "add", "dev", node.ifname, "root", *TBF)
        cfg = tmp_path / "pd.json"
        cfg.write_text(json.dumps({
            "model": path, "prompts": prompts, "tokens": TOKENS,
            "log_dir": str(tmp_path / "logs"), "out": str(tmp_path / "out.json"),
            "prefill_netns": prefill.netns, "prefill_ip": prefill.ip,
            "decode_ip": decode.ip,
            "serve": ["--dtype", parity_dtype, "--max-model-len", "1024", "--seed", "0",
                      "--kv-cache-memory-bytes", str(128 << 20)]}))
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        env.update(PYTHONPATH=REPO, VLLM_WORKER_MULTIPROC_METHOD="fork")
        res = subprocess.run(["ip", "netns", "exec", decode.netns, sys.executable, "-m",
                              "tests.helpers.pd_link", str(cfg)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=900)
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((tmp_path / "logs").glob("*.log")))
        assert res.returncode == 0, res.stderr[-3000:] + logs
        stats = _tc(prefill.netns, "-s", "qdisc", "show", "dev", prefill.ifname)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["tokens"] == [hf_greedy(path, p, TOKENS) for p in prompts]
    assert out["state"] == {"prefill": [0.0, 0.0, 0.0], "decode": [0.0, 0.0, 0.0]}
    sent, dropped = (int(x) for x in re.search(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+)",
                                               stats).groups())
    assert out["kv_bytes"] > 0 and sent >= out["kv_bytes"], (out, stats)
    assert dropped > 0, stats
    # The KV took at least the time the link's rate allows (the write's own clock).
    assert out["xfer_s"] >= 0.8 * out["kv_bytes"] * 8 / RATE_BIT_S, out
