"""A PD deployment whose prefill and decode instances sit on two simulated hosts (network
namespaces joined by a veth pair, tests/helpers/ray_nodes.Hosts): run inside the decode
host's namespace as `python -m tests.helpers.pd_link CONFIG.json`; the prefill instance is
started in the other namespace (`ip netns exec`), the router beside the decode instance.

It sends the config's prompts at once through the router, then reads what the test checks
from inside the namespace (the test process cannot reach these addresses) and writes it to
the config's `out`: the tokens, the prefill side's Mooncake transfer bytes and time, and every
instance's (KV usage, running, waiting) once idle."""
from __future__ import annotations

import concurrent.futures as cf
import json
import sys
import time
from pathlib import Path

import requests

from tests.helpers.pd import busy, metric
from vllm_npu.disagg.launch import PDCluster


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    cluster = PDCluster(cfg["model"], log_dir=Path(cfg["log_dir"]), serve_args=cfg["serve"],
                        hosts={"prefill": cfg["prefill_ip"], "decode": cfg["decode_ip"],
                               "proxy": cfg["decode_ip"]},
                        wrap={"prefill": ["ip", "netns", "exec", cfg["prefill_netns"]]},
                        env=cfg.get("env", {}))
    with cluster:
        def ask(prompt: list[int]) -> list[int]:
            reply = requests.post(f"{cluster.url}/v1/completions", timeout=600, json={
                "model": cfg["model"], "prompt": prompt, "max_tokens": cfg["tokens"],
                "temperature": 0, "ignore_eos": True, "return_token_ids": True})
            reply.raise_for_status()
            return reply.json()["choices"][0]["token_ids"]

        t0 = time.time()
        with cf.ThreadPoolExecutor(len(cfg["prompts"])) as pool:
            tokens = list(pool.map(ask, cfg["prompts"]))
        took = time.time() - t0
        prefill, decode = cluster.prefills[0].url, cluster.decodes[0].url
        deadline = time.time() + 60
        while any(busy(u) != (0.0, 0.0, 0.0) for u in (prefill, decode)) and \
                time.time() < deadline:
            time.sleep(0.5)
        Path(cfg["out"]).write_text(json.dumps({
            "tokens": tokens, "seconds": took,
            "kv_bytes": metric(prefill, "vllm:mooncake_bytes_transferred_sum"),
            "xfer_s": metric(prefill, "vllm:mooncake_xfer_time_seconds_sum"),
            "state": {"prefill": busy(prefill), "decode": busy(decode)}}))


if __name__ == "__main__":
    main(sys.argv[1])
