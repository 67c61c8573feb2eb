"""Where the simulated NPU's time goes: cProfile of in-process `LLM.generate`, own time
bucketed by owner (the plugin's simulated ops, graph replay, attention builders, vLLM's
runner, sampler, scheduler, the model code, torch), for a prefill-only and a decode-heavy run.

    python tools/profile_steps.py [--prompts 64] [--prompt-len 128] [--out-len 128]

Two profiled runs of the same prompts (each after an unprofiled warm-up of the same shapes):
1 output token (the prefill steps) and `--out-len` tokens; the decode steps' share is their
difference, bucket by bucket. cProfile adds per-call overhead, so shares, not seconds, are the
result.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (bucket, path fragment) in match order: the first fragment found in a function's file wins.
BUCKETS = (
    ("plugin: simulated ops", "vllm_npu/ops/sim/"),
    ("plugin: graph capture/replay", "vllm_npu/compilation/"),
    ("plugin: attention backends", "vllm_npu/attention/"),
    ("plugin: worker/runner", "vllm_npu/worker/"),
    ("plugin: other", "vllm_npu/"),
    ("vLLM: scheduler + KV manager", "vllm/v1/core/"),
    ("vLLM: sampler", "vllm/v1/sample/"),
    ("vLLM: model runner", "vllm/v1/worker/"),
    ("vLLM: engine core / outputs", "vllm/v1/engine/"),
    ("vLLM: model code", "vllm/model_executor/"),
    ("vLLM: other", "/vllm/"),
    ("torch (Python side)", "/torch/"),
)


def bucket_of(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<built-in"):
        return "builtins (torch ops, C calls)"
    for name, fragment in BUCKETS:
        if fragment in filename:
            return name
    return "other Python"


def own_time(stats: pstats.Stats) -> dict[str, float]:
    own: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        own[bucket_of(filename)] += tottime
    return own


def table(own: dict[str, float], title: str) -> None:
    total = sum(own.values())
    print(f"\n{title}: own time {total:.2f} s\n")
    print("| owner | own s | share |")
    print("| --- | ---: | ---: |")
    for name, t in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {t:.3f} | {t / total:.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--top", type=int, default=0, help="also print the N top functions")
    args = ap.parse_args()

    import torch
    from vllm import LLM, SamplingParams

    from vllm_npu.testing.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(f"{tmp}/qwen2", "qwen2")
        llm = LLM(path, dtype="float32", max_model_len=args.prompt_len + args.out_len + 8,
                  seed=0, kv_cache_memory_bytes=1 << 30)
        g = torch.Generator().manual_seed(0)
        prompts = [{"prompt_token_ids": torch.randint(2, 256, (args.prompt_len,),
                                                      generator=g).tolist()}
                   for _ in range(args.prompts)]
        owns = []
        for n in (1, args.out_len):
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            llm.generate(prompts, params, use_tqdm=False)  # warm-up, same shapes
            llm.reset_prefix_cache()
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            llm.generate(prompts, params, use_tqdm=False)
            prof.disable()
            wall = time.perf_counter() - t0
            llm.reset_prefix_cache()
            stats = pstats.Stats(prof)
            owns.append(own_time(stats))
            print(f"{args.prompts} x ({args.prompt_len} + {n}) tokens: {wall:.2f} s profiled")
            if args.top:
                stats.sort_stats("tottime").print_stats(args.top)
        prefill, whole = owns
        table(prefill, f"prefill steps ({args.prompts} prompts x {args.prompt_len} tokens)")
        table({k: whole[k] - prefill.get(k, 0.0) for k in whole},
              f"decode steps ({args.prompts} requests x {args.out_len - 1} tokens)")


if __name__ == "__main__":
    main()
