"""What the platform does before vLLM forks workers from a process that already ran an engine
(vllm_npu/fork_safety.py). The whole sequence (an in-process engine, then a TP=2 one) is in
tests/e2e/test_parallel.py and test_spec_decode_tp.py; here, the numba rule on its own."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, numba, numpy as np
os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
from vllm_npu.fork_safety import numba_openmp_in_use, prepare_to_fork_workers
before = numba_openmp_in_use()
prepare_to_fork_workers()
untouched = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")

@numba.njit(parallel=True)
def total(x):
    s = 0.0
    for i in numba.prange(x.shape[0]):
        s += x[i]
    return s

total(np.ones(1000))  # starts numba's thread pool, as vLLM's n-gram proposer does
prepare_to_fork_workers()
print(before, untouched, numba.threading_layer(), os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))
"""


def test_workers_spawn_once_numba_runs_gnu_openmp_here():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    before, untouched, layer, method = run.stdout.split()
    assert (before, untouched) == ("False", "None")  # nothing ran: vLLM's default stays
    # GNU OpenMP (the layer numba picks here) kills a forked child that uses it; tbb does not
    assert method == ("spawn" if layer == "omp" else "None")
