"""One MoE layer on the simulated NPU: host-dispatched ops and time per batch size, and the
expert-parallel bytes per step of all-to-all vs all-gather dispatch/combine.

    .venv/bin/python benchmarks/moe.py [--hidden 512 --inter 256 --experts 64 --top-k 8]

Ops = entries of a captured simulated ACL graph of the layer (each op-surface call is one
task, every other aten op one entry): what the host launches per layer without graphs.
Bytes per EP rank and step, bf16 activations, routing drawn from random router logits:
  all-gather: receive the other DP ranks' tokens (hidden + k weights + k ids), then
              reduce-scatter the [DP x T, H] partial outputs (send (DP-1) x T x H);
  all-to-all: counts (EP int64) + each token once to every other rank holding one of
              its experts (hidden + k weights + k slots) and one row back (hidden).
"""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch
from timing import median_ms  # benchmarks/ is the script's path entry

from vllm_npu.moe.expert_map import ExpertPlacement, to_physical
from vllm_npu.moe.experts import FloatExperts, run_local_experts
from vllm_npu.moe.routing import select_experts
from vllm_npu.ops.sim.graph import SimGraph

BATCHES = (1, 4, 16, 64, 256)


def _layer(experts: int, top_k: int) -> SimpleNamespace:
    return SimpleNamespace(scoring_func="softmax", renormalize=True, use_grouped_topk=False,
                           num_expert_group=None, topk_group=None, top_k=top_k,
                           e_score_correction_bias=None, routed_scaling_factor=1.0,
                           custom_routing_function=None)


def moe_forward(layer, x, logits, w13, w2, tables):
    weights, ids = select_experts(layer, x, logits)
    slots = to_physical(ids, *tables)
    return run_local_experts(x, weights.to(x.dtype), slots, FloatExperts(w13, w2), 0,
                             w13.shape[0])


def op_table(args) -> list[str]:
    g = torch.Generator().manual_seed(args.seed)
    w13 = torch.randn(args.experts, 2 * args.inter, args.hidden, generator=g) * 0.05
    w2 = torch.randn(args.experts, args.hidden, args.inter, generator=g) * 0.05
    layer = _layer(args.experts, args.top_k)
    tables = ExpertPlacement.linear(args.experts, 1).tables()
    rows = ["| batch | host ops / layer | eager ms | graph replay ms |", "|---:|---:|---:|---:|"]
    for batch in BATCHES:
        x = torch.randn(batch, args.hidden, generator=g)
        logits = torch.randn(batch, args.experts, generator=g)
        graph = SimGraph()
        graph.capture_begin()
        with torch.inference_mode():
            moe_forward(layer, x, logits, w13, w2, tables)
        graph.capture_end()
        eager = median_ms(lambda: moe_forward(layer, x, logits, w13, w2, tables), args.repeats,
                          warmup=1)
        replay = median_ms(graph.replay, args.repeats, warmup=1)
        rows.append(f"| {batch} | {len(graph.entries)} | {eager:.2f} | {replay:.2f} |")
    return rows


def bytes_table(args) -> list[str]:
    g = torch.Generator().manual_seed(args.seed + 1)
    h, k, e = args.hidden, args.top_k, args.experts
    act = 2  # bf16
    rows = ["| EP=DP | tokens / rank | all-gather KiB | all-to-all KiB | a2a / ag |",
            "|---:|---:|---:|---:|---:|"]
    for ep in (d for d in (2, 8, 32) if args.experts % d == 0):
        slots = e // ep
        for tokens in (1, 16, 256):
            logits = torch.randn(tokens, e, generator=g)
            ids = logits.topk(k, dim=-1).indices
            ranks = torch.zeros(tokens, ep, dtype=torch.bool).scatter_(1, ids // slots, True)
            remote = int(ranks[:, 1:].sum())  # (token, rank) trips of rank 0's tokens
            gather = (ep - 1) * tokens * (h * act + k * act + k * 4)
            scatter = (ep - 1) * tokens * h * act
            a2a = ep * 8 + remote * (h * act + k * act + k * 4) + remote * h * act
            ag = gather + scatter
            rows.append(f"| {ep} | {tokens} | {ag / 1024:.1f} | {a2a / 1024:.1f} | "
                        f"{a2a / ag:.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inter", type=int, default=256)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"## One MoE layer (H={args.hidden}, I={args.inter}, E={args.experts}, "
          f"k={args.top_k}, float32, simulated NPU, 1 thread)\n")
    print("\n".join(op_table(args)))
    print(f"\n## Expert-parallel bytes per rank per MoE layer (H={args.hidden}, "
          f"k={args.top_k}, E={args.experts}, bf16)\n")
    print("\n".join(bytes_table(args)))


if __name__ == "__main__":
    main()
