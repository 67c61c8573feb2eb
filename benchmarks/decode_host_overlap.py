"""Host time per decode step with async scheduling on vs off, and tokens per step with
speculative decoding, on the simulated NPU (offline LLM.generate, in-process engine).

For each batch size B: B prompts of 16 tokens, `--tokens` greedy output tokens each. Per
engine step (vLLM's EngineCore.step, counted when it ran the model):

    step ms      wall time of the whole generate / steps
    forward ms   time inside the target model's forward and the draft model's (the
                 device's work; on the simulator it runs on the host too, so async
                 scheduling cannot hide it here)
    host ms      step ms - forward ms: scheduling, input preparation, sampling, draft
                 bookkeeping, output processing — what a real NPU's host does per step
    tok/step     output tokens / steps (> 1 only with speculation)

Engines: async scheduling off, on (vLLM's default), and on with speculation: a draft
model that is the target itself (every draft accepted, the upper bound) and n-gram
lookup on repetitive prompts (vLLM runs n-gram synchronously). Medians of `--repeats`
runs; ratios are only meaningful within one run on a quiet machine.

    python benchmarks/decode_host_overlap.py [--batches 1 4 16 64] [--tokens 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from timing import timed  # benchmarks/ is the script's path entry

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

ENGINES = {  # name -> LLM overrides (speculative config filled in with the model path)
    "async off": dict(async_scheduling=False),
    "async on": dict(async_scheduling=True),
    "async on + draft_model k=3": dict(speculative={"method": "draft_model",
                                                    "num_speculative_tokens": 3}),
    "n-gram k=3 (sync)": dict(speculative={"method": "ngram", "num_speculative_tokens": 3,
                                           "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
}


def _prompts(batch: int, vocab: int, repetitive: bool) -> list[list[int]]:
    import torch

    out = []
    for i in range(batch):
        g = torch.Generator().manual_seed(1000 + i)
        if repetitive:
            out.append(torch.randint(2, vocab, (4,), generator=g).tolist() * 4)
        else:
            out.append(torch.randint(2, vocab, (16,), generator=g).tolist())
    return out


class _Timers:
    """Counts engine steps that ran the model and the time inside the model forward."""

    def __init__(self, llm) -> None:
        from vllm_npu.worker.model_runner import NPUModelRunner

        self.steps = 0
        self.forward_s = 0.0
        core = llm.llm_engine.engine_core.engine_core
        step_fn = core.step_fn

        def step():
            outputs, executed = step_fn()
            self.steps += int(executed)
            return outputs, executed

        core.step_fn = step
        forward = NPUModelRunner._model_forward
        NPUModelRunner._model_forward = timed(forward, self._add_forward)
        self._restore = lambda: setattr(NPUModelRunner, "_model_forward", forward)
        drafter = getattr(llm.llm_engine.model_executor.driver_worker.worker.model_runner,
                          "drafter", None)
        draft_model = getattr(drafter, "model", None)
        if draft_model is not None:
            draft_model.forward = timed(draft_model.forward, self._add_forward)

    def _add_forward(self, seconds: float) -> None:
        self.forward_s += seconds

    def close(self) -> None:
        self._restore()


def _run(llm, timers: _Timers, prompts, tokens: int) -> tuple[float, float, float]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    steps0, fwd0 = timers.steps, timers.forward_s
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    steps = timers.steps - steps0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    return wall * 1e3 / steps, (timers.forward_s - fwd0) * 1e3 / steps, produced / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    args = parser.parse_args()

    from vllm import LLM

    from vllm_npu.testing.tiny_model import build_tiny_model

    model = build_tiny_model(os.path.join(tempfile.gettempdir(), "vllm-npu-bench-llama"),
                             arch="llama")
    vocab = 400
    rows = []
    for name in args.engines:
        overrides = dict(ENGINES[name])
        spec = overrides.pop("speculative", None)
        if spec is not None and spec["method"] == "draft_model":
            spec = dict(spec, model=model)
        llm = LLM(model, dtype="float32", max_model_len=512, seed=0,
                  max_num_seqs=max(args.batches), max_num_batched_tokens=2048,
                  speculative_config=spec, **overrides)
        timers = _Timers(llm)
        try:
            repetitive = spec is not None and spec["method"] == "ngram"
            _run(llm, timers, _prompts(2, vocab, repetitive), 4)  # warm-up
            for batch in args.batches:
                prompts = _prompts(batch, vocab, repetitive)
                samples = [_run(llm, timers, prompts, args.tokens)
                           for _ in range(args.repeats)]
                step, fwd, tps = (statistics.median(s[i] for s in samples) for i in range(3))
                rows.append((name, batch, step, fwd, step - fwd, tps))
        finally:
            timers.close()
            llm.llm_engine.engine_core.shutdown()
            del llm
    print("| engine | batch | step ms | forward ms | host ms | tok/step | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for name, batch, step, fwd, host, tps in rows:
        print(f"| {name} | {batch} | {step:.2f} | {fwd:.2f} | {host:.2f} | {tps:.2f} | "
              f"{tps * 1e3 / step:.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
