"""PD disaggregation on loopback: KV bytes per request, Mooncake transfer time and TTFT per
prompt length, against the same prompt on one instance.

Starts a 1P1D deployment (vllm_npu.disagg.launch.PDCluster: `vllm serve --device npu`
prefill and decode instances, MooncakeConnector over TCP, the plugin's router) and sends
each prompt length `--requests` times, one at a time, streaming:

- KV bytes / request and transfer ms: the prefill instance's own transfer metrics
  (`vllm:mooncake_bytes_transferred`, `vllm:mooncake_xfer_time_seconds`, recorded around the
  transfer engine's batch write), per request;
- TTFT PD: first streamed token through the router (prefill, transfer, first decode step);
- TTFT single: the same prompt streamed from the prefill instance itself as an ordinary
  request (no KV transfer): the one-instance baseline on the same process and weights.

Every prompt is new (random tokens, its own seed), so no prefix cache hides work.

    python benchmarks/pd_transfer.py --lengths 128 256 512 1024 2048 4096 --requests 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_npu.disagg.launch import PDCluster  # noqa: E402
from vllm_npu.testing.tiny_model import build_tiny_model  # noqa: E402


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def ttft_ms(url: str, model: str, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    with requests.post(f"{url}/v1/completions", stream=True, timeout=600, json={
            "model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
            "ignore_eos": True, "stream": True}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {reply.text[:500]}")
        for line in reply.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                if json.loads(line[6:])["choices"][0]["text"] is not None:
                    return (time.perf_counter() - t0) * 1e3
    raise RuntimeError("the stream ended without a token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+",
                    default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--requests", type=int, default=5, help="per prompt length")
    ap.add_argument("--prefill-tp", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model", help="a checkpoint; default: a tiny Llama built here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        longest = max(args.lengths) + 8
        model = args.model or build_tiny_model(f"{tmp}/tiny-llama", "llama",
                                               max_position_embeddings=max(2048, longest))
        serve = ["--dtype", args.dtype, "--max-model-len", str(longest),
                 "--max-num-batched-tokens", str(max(2048, longest)), "--max-num-seqs", "8",
                 "--kv-cache-memory-bytes", str(512 << 20)]  # host memory when simulated
        with PDCluster(model, prefill_tp=(args.prefill_tp,), serve_args=serve,
                       log_dir=Path(tmp) / "logs") as cluster:
            prefill = cluster.prefills[0].url
            print(f"1P1D (prefill TP={args.prefill_tp}), {args.dtype}, loopback TCP, "
                  f"{args.requests} requests per length, torch {torch.__version__}\n")
            print("| prompt tokens | KV bytes / request | transfer ms | TTFT PD ms "
                  "| TTFT single ms | PD / single |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: |")
            for length in args.lengths:
                g = torch.Generator().manual_seed(1000 + length)
                prompts = [torch.randint(2, 256, (length,), generator=g).tolist()
                           for _ in range(2 * args.requests)]
                b0 = metric(prefill, "vllm:mooncake_bytes_transferred_sum")
                t0 = metric(prefill, "vllm:mooncake_xfer_time_seconds_sum")
                n0 = metric(prefill, "vllm:mooncake_xfer_time_seconds_count")
                pd = [ttft_ms(cluster.url, model, p) for p in prompts[:args.requests]]
                time.sleep(1.5)  # the engine publishes connector stats with its next log
                n = metric(prefill, "vllm:mooncake_xfer_time_seconds_count") - n0
                kv = (metric(prefill, "vllm:mooncake_bytes_transferred_sum") - b0) \
                    / args.requests
                xfer = (metric(prefill, "vllm:mooncake_xfer_time_seconds_sum") - t0) \
                    / max(n, 1) * 1e3
                single = [ttft_ms(prefill, model, p) for p in prompts[args.requests:]]
                a, b = statistics.median(pd), statistics.median(single)
                print(f"| {length} | {kv:,.0f} | {xfer:.2f} | {a:.1f} | {b:.1f} "
                      f"| {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
