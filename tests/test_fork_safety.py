"""What the platform does before vLLM forks workers from a process that already ran an engine
(vllm_npu/fork_safety.py). The whole sequence (an in-process engine, then a TP=2 one) is in
tests/e2e/test_parallel.py and test_spec_decode_tp.py; here, each rule on its own."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, numba, numpy as np
os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
from vllm_npu.fork_safety import numba_openmp_in_use, prepare_to_fork_workers
before = numba_openmp_in_use()
prepare_to_fork_workers(True, True)
untouched = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")

@numba.njit(parallel=True)
def total(x):
    s = 0.0
    for i in numba.prange(x.shape[0]):
        s += x[i]
    return s

total(np.ones(1000))  # starts numba's thread pool, as vLLM's n-gram proposer does
prepare_to_fork_workers(True, False)  # an in-process engine (no processes): nothing to do
assert os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") is None
prepare_to_fork_workers(True, True)
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


BAD_FORK_SCRIPT = r"""
import os
os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
from vllm_npu.fork_safety import claim_simulated_npu, npu_initialized_here, prepare_to_fork_workers
prepare_to_fork_workers(True, True)
before = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
claim_simulated_npu()   # what an in-process engine's worker does
claim_simulated_npu()   # again in the same process: fine
pid = os.fork()
if pid == 0:            # a worker forked now
    try:
        claim_simulated_npu()
    except RuntimeError as e:
        print("CHILD", e, flush=True)
        os._exit(3)
    os._exit(0)
_, status = os.waitpid(pid, 0)
prepare_to_fork_workers(True, True)
print("PARENT", before, npu_initialized_here(True), os.waitstatus_to_exitcode(status),
      os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))
"""


def test_a_child_forked_after_the_npu_initialised_is_refused_and_workers_spawn():
    run = subprocess.run([sys.executable, "-c", BAD_FORK_SCRIPT], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    child = [line for line in run.stdout.splitlines() if line.startswith("CHILD ")]
    # torch_npu's _lazy_init message in a child forked after initialisation
    assert child == ["CHILD Cannot re-initialize NPU in forked subprocess. To use NPU with "
                     "multiprocessing, you must use the 'spawn' start method"]
    parent = [line for line in run.stdout.splitlines() if line.startswith("PARENT ")]
    assert parent == ["PARENT None True 3 spawn"]
    assert "the NPU is initialised in this process" in run.stderr
