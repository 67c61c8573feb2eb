"""Decode-step host cost, eager vs ACL graph replay, for batch sizes 1…256.

Builds the bundled tiny model on the (simulated) NPU with FULL_DECODE_ONLY graphs captured
at every measured batch size, then for each batch size times one uniform-decode forward
run eagerly and one replayed from its graph (task updates included), and counts the ops
the host dispatches per step, as measured by the simulated graph: eager = every aten op
and device op of the captured forward; replay = graph launches plus the task updates
issued (2 per attention layer expected). On the simulated NPU a
replay still executes every op on the CPU, so its *time* is not a device prediction; the
dispatch counts are what a device sees.

    python benchmarks/graph_replay.py [--batches 1 2 4 ... 256] [--iters 5]
"""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from timing import median_ms  # noqa: E402  (benchmarks/ is the script's path entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+",
                        default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--model", default=None, help="model path (default: build tiny)")
    args = parser.parse_args()

    import torch
    from vllm import LLM
    from vllm.config import CUDAGraphMode

    from vllm_npu.compilation.acl_graph import ACLGraphWrapper
    from vllm_npu.ops.sim.graph import SimGraph
    from vllm_npu.testing.tiny_model import build_tiny_model

    model = args.model or build_tiny_model(os.path.join(tempfile.gettempdir(),
                                                        "vllm_npu-bench-llama"))
    batches = sorted(args.batches)
    llm = LLM(model, dtype="float32", max_model_len=256, max_num_seqs=max(batches),
              max_num_batched_tokens=max(256, max(batches)), seed=0,
              compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                  "cudagraph_capture_sizes": batches})
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner

    # Every FULL replay refreshes the attention tasks first (ACLGraphWrapper.before_replay).
    graph_model = runner.model
    print("| batch | eager ms/step | replay ms/step | eager host ops | replay host ops |")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for b in batches:
            def run(mode):
                return runner._dummy_run(b, cudagraph_runtime_mode=mode, uniform_decode=True,
                                         force_attention=True, skip_eplb=True)

            eager = median_ms(lambda: run(CUDAGraphMode.NONE), args.iters)
            entry = next(e for d, e in graph_model.entries.items() if d.num_tokens == b)
            simulated = isinstance(entry.graph, SimGraph)
            replays0 = ACLGraphWrapper.stats.replays
            updates0 = sum(t.updates for t in entry.graph.tasks) if simulated else 0
            replay = median_ms(lambda: run(CUDAGraphMode.FULL), args.iters)
            replays = ACLGraphWrapper.stats.replays - replays0
            assert replays == args.iters, "graph not replayed"
            if simulated:  # measured: ops in the captured forward; launches + task updates
                eager_ops = len(entry.graph.entries)
                updated = sum(t.updates for t in entry.graph.tasks) - updates0
                replay_ops = f"{(replays + updated) / replays:g}"
            else:
                eager_ops = replay_ops = "-"
            print(f"| {b} | {eager:.2f} | {replay:.2f} | {eager_ops} | {replay_ops} |")


if __name__ == "__main__":
    main()
