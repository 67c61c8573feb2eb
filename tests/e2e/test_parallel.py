"""Tensor, pipeline and data parallel serving on the simulated NPU (vLLM's multiprocessing
executor, gloo device groups on 127.0.0.1): greedy tokens identical to one device, which
test_offline_parity shows equals HF transformers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.engine import generate, make_llm, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt
from tests.helpers.server import complete, serve

def _hccl_library_of_model_parallel_groups(worker) -> str:
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    group = get_tp_group() if get_tp_group().world_size > 1 else get_pp_group()
    return group.device_communicator.hccl.lib.path


def _tokens_and_hccl_libraries(path: str, dtype: str, prompts, tp: int, pp: int):
    """In the engine host: 16 greedy tokens per prompt and each worker's HCCL library."""
    llm = make_llm(path, dtype, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                   distributed_executor_backend="mp", enable_sleep_mode=False)
    try:
        return generate(llm, prompts, 16), \
            llm.collective_rpc(_hccl_library_of_model_parallel_groups)
    finally:
        shutdown(llm)


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_tp_pp_match_single_device(tiny_models, parity_dtype, engine_host, tp, pp):
    path = tiny_models["llama"]  # 4 heads / 2 kv heads / 2 layers: splits evenly in 2
    prompts = [random_prompt(40 + i, 20 + 50 * i, vocab(path)) for i in range(3)]
    got, libs = engine_host.run(_tokens_and_hccl_libraries, path, parity_dtype, prompts,
                                tp, pp)
    assert got == [hf_greedy(path, p, 16) for p in prompts]
    # The collectives really went through the HCCL binding (the CPU HCCL simulator).
    assert all(lib.endswith("libhccl_sim.so") for lib in libs)


# A user's script, in a fresh interpreter (not this test process, whose gc is tuned in
# conftest): an in-process MoE engine, then a TP=2 one. vLLM would fork the workers (its
# default off CUDA); a device refuses a child forked after the NPU was initialised, and the
# first engine's gloo group, left in a reference cycle, hung forked workers. The platform
# spawns them (vllm_npu/fork_safety.py).
_ONE_ENGINE_THEN_TP2 = """
import json, sys
from vllm import LLM, SamplingParams
path, dtype, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
got = []
for tp in (1, 2):
    llm = LLM(path, dtype=dtype, max_model_len=256, tensor_parallel_size=tp)
    got.append(list(llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids))
    del llm
print("TOKENS", json.dumps(got))
"""


def test_a_tp2_engine_after_an_in_process_engine_in_one_script(parity_dtype, tmp_path):
    from vllm_npu.testing.tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path / "tiny-qwen3-moe"), arch="qwen3_moe")
    prompt = random_prompt(7, 30, vocab(path))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in the script's own process
    run = subprocess.run([sys.executable, "-c", _ONE_ENGINE_THEN_TP2, path, parity_dtype,
                          json.dumps(prompt)], capture_output=True, text=True, timeout=240,
                         env=env)
    lines = [line for line in run.stdout.splitlines() if line.startswith("TOKENS ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    assert json.loads(lines[0][len("TOKENS "):]) == [hf_greedy(path, prompt, 8)] * 2
    # the first engine initialised the NPU in this process: the TP=2 workers spawned
    assert "workers spawn instead of forking" in run.stdout, run.stdout[-3000:]  # vLLM logs there


def test_data_parallel_serving_matches_single_device(tiny_models, parity_dtype, tmp_path):
    """--data-parallel-size 2: two engine cores, a DP coordinator and two API server
    processes (vLLM's default for DP=2; the MoE DP tests run one)."""
    path = tiny_models["llama"]
    prompts = [random_prompt(60 + i, 10 + 17 * i, vocab(path)) for i in range(4)]
    with serve(path, tmp_path, "--dtype", parity_dtype, "--max-model-len", "512",
               "--data-parallel-size", "2") as base:
        got = [complete(base, p, 12) for p in prompts]
    assert got == [hf_greedy(path, p, 12) for p in prompts]
