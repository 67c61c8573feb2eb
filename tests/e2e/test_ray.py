"""Ray on one host as users start it: no cluster started beforehand. vLLM starts a local Ray;
on the simulated NPU its node must advertise the simulated NPUs (vllm_npu/distributed/
ray_executor.py). Ray listens on every interface, so each server runs in a network namespace
of its own with loopback only (tests/helpers/ray_nodes.py)."""
from __future__ import annotations

import pytest

from tests.helpers.engine import vocab
from tests.helpers.ray_nodes import Hosts, actors_on, complete_on, netns_available
from tests.helpers.ray_nodes import readme_commands, wait_healthy
from tests.helpers.reference import hf_greedy, random_prompt

pytestmark = pytest.mark.skipif(not netns_available(),
                                reason="needs root + network namespaces (Ray off loopback)")
SERVE_ARGS = ("--host 127.0.0.1 --port 8000 --served-model-name tiny --dtype float32 "
              "--max-model-len 512 --num-gpu-blocks-override 16")


@pytest.fixture
def host():
    pytest.importorskip("ray")
    with Hosts(1, npus=8) as hosts:
        yield hosts.nodes[0]


def _serve(node, command: str, values: dict, log):
    return node.start(f"{command} {SERVE_ARGS}", log, env=values)


def test_readme_single_host_line_matches_hf(host, tiny_models, parity_dtype, tmp_path):
    """The README's single-host line, as written, with no Ray cluster running: vLLM's local
    Ray counts the simulated NPUs and TP=2 gives HF's tokens."""
    model = tiny_models["llama"]
    (step,) = readme_commands("ray-single-host")
    log = tmp_path / "serve.log"
    server = _serve(host, step.command, {"MODEL": model}, log)
    wait_healthy(host, 8000, server, log)
    prompts = [random_prompt(70 + i, 20 + 40 * i, vocab(model)) for i in range(2)]
    assert complete_on(host, prompts, 12) == [hf_greedy(model, p, 12) for p in prompts]
    assert actors_on(host, "RayWorkerProc") == 2
    assert "started a local Ray whose node has 8 simulated NPUs" in log.read_text()


def test_too_few_npus_fails_in_seconds(host, tiny_models, tmp_path):
    """TP=2 x PP=2 on a host whose Ray has 2 NPUs: the server exits at startup with the
    numbers and the fix (vLLM alone warned and waited 1800 s for the placement group)."""
    host.npus = 2
    log = tmp_path / "serve.log"
    server = _serve(host, "vllm serve $MODEL --device npu --tensor-parallel-size 2 "
                    "--pipeline-parallel-size 2 --distributed-executor-backend ray",
                    {"MODEL": tiny_models["llama"]}, log)
    rc = server.wait(timeout=300)
    text = log.read_text()
    assert rc != 0
    assert ("The Ray executor needs 4 NPUs (tensor 2 x pipeline 2 x prefill context 1) but "
            'the Ray cluster has 2: {"127.0.0.1": 2}') in text, text[-3000:]
    assert """ray start --head --resources '{"NPU": 8}'""" in text


def test_data_parallel_over_ray_single_host(host, tmp_path):
    """--data-parallel-backend ray with expert parallelism on a MoE model, no cluster
    started: the platform starts Ray with the simulated NPUs before vLLM's DP manager asks;
    each DP rank's engine is a Ray actor. HF's tokens."""
    from vllm_npu.testing.tiny_model import build_tiny_model

    model = build_tiny_model(str(tmp_path / "moe"), arch="qwen3_moe")
    log = tmp_path / "serve.log"
    server = _serve(host, "vllm serve $MODEL --device npu --data-parallel-size 2 "
                    "--data-parallel-backend ray --enable-expert-parallel",
                    {"MODEL": model}, log)
    wait_healthy(host, 8000, server, log)
    prompts = [random_prompt(80 + i, 12 + 30 * i, vocab(model)) for i in range(4)]
    assert complete_on(host, prompts, 10) == [hf_greedy(model, p, 10) for p in prompts]
    assert actors_on(host, "DPMoEEngineCoreActor") == 2
    assert log.read_text().count("started a local Ray") == 1  # one Ray, not one per server
