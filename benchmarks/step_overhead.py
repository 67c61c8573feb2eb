"""Host time per decode step spent in the plugin: slot mapping + attention metadata.

For B decode requests of context length L (one new token each), times what the plugin adds
to every step on the host — `compute_slot_mapping` (the runner's token -> KV slot map) and
`NPUAttentionMetadataBuilder.build` (host lists for the fused ops, int32 tables) — and
prints a markdown table. It should grow at most linearly with B and not with L.

    python benchmarks/step_overhead.py [--iters 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 4096])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| batch | context | slot mapping µs | metadata µs | total µs | µs / request |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        for context in args.contexts:
            slot, build = measure(batch, context, args.iters)
            total = slot + build
            print(f"| {batch} | {context} | {slot:.1f} | {build:.1f} | {total:.1f} | "
                  f"{total / batch:.2f} |")


if __name__ == "__main__":
    main()
