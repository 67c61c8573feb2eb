"""Several nodes as the README says: two simulated hosts (network namespaces joined by a veth
pair, tests/helpers/ray_nodes.py), each with its own `ray start` and NPUs, started with the
README's multi-node lines as written. Then data + expert parallelism across the nodes, the
README's TP-within / PP-across server, and a worker node lost mid-request."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from tests.helpers.engine import vocab
from tests.helpers.ray_nodes import Hosts, Recipe, Step, actors_on, client, complete_on
from tests.helpers.ray_nodes import netns_available
from tests.helpers.ray_nodes import readme_commands, wait_healthy
from tests.helpers.reference import hf_greedy, random_prompt

pytestmark = pytest.mark.skipif(not netns_available(),
                                reason="needs root + network namespaces")
PORT = 8000
SERVE_ARGS = (f"--port {PORT} --served-model-name tiny --dtype float32 --max-model-len 512 "
              "--num-gpu-blocks-override 16")


@pytest.fixture(scope="module")
def cluster(tiny_models):
    """The README's lines up to `vllm serve`, run on two hosts: a 2-node Ray, 2 NPUs each."""
    pytest.importorskip("ray")
    steps = readme_commands("ray-multi-node")
    assert [s.nodes for s in steps] == [[1, 2], [1], [1], [2], [2], [1]]
    with Hosts(2, npus=2) as hosts:
        a, b = hosts.nodes
        recipe = Recipe(hosts.nodes, {"HEAD_IP": a.ip, "NODE_IP": b.ip, "NPUS": "2",
                                      "MODEL": tiny_models["llama"]})
        for step in steps[:-1]:
            recipe.run(step)
        deadline = time.time() + 90  # the head's status lists a joined node within seconds
        while True:
            res = a.run(recipe.exports[1] + "ray status", env=recipe.values, timeout=120)
            if "0.0/4.0 NPU" in res.stdout or time.time() > deadline:
                break
            time.sleep(2)
        assert "0.0/4.0 NPU" in res.stdout, res.stdout
        yield hosts, recipe, steps[-1]


def _stop(server, node) -> None:
    """Stop `vllm serve` and wait until nothing on `node` listens on its port any more: its
    API server processes (one per DP rank) share the socket and may outlive the parent (a
    later server on the port once failed with "Address already in use" 13 s after the last
    one had logged its shutdown)."""
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
    deadline = time.time() + 60
    while listening := node.run(f"ss -ltnpH 'sport = :{PORT}'").stdout.strip():
        if time.time() > deadline:  # the server's session: every process it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
        if time.time() > deadline + 30:
            raise RuntimeError(f"port {PORT} on {node.ip} still taken 90 s after `vllm serve` "
                               f"was stopped: {listening}")
        time.sleep(1)


def test_data_and_expert_parallel_across_nodes(cluster, tmp_path):
    """DP=2 over Ray with one rank per node and EP over both: each node runs one DP engine
    and its worker; HF's tokens."""
    from vllm_npu.testing.tiny_model import build_tiny_model

    hosts, recipe, serve = cluster
    a, b = hosts.nodes
    model = build_tiny_model(str(tmp_path / "moe"), arch="qwen3_moe")
    step = Step([1], "vllm serve $MOE --device npu --data-parallel-size 2 "
                "--data-parallel-size-local 1 --data-parallel-backend ray "
                "--data-parallel-address $HEAD_IP --enable-expert-parallel", None)
    log = tmp_path / "serve.log"
    server = recipe.start(step, f"--host {a.ip} {SERVE_ARGS}", log, env={"MOE": model})
    try:
        wait_healthy(a, PORT, server, log)
        prompts = [random_prompt(90 + i, 12 + 30 * i, vocab(model)) for i in range(4)]
        assert complete_on(a, prompts, 10) == [hf_greedy(model, p, 10) for p in prompts]
        assert [actors_on(n, "DPMoEEngineCoreActor") for n in (a, b)] == [1, 1]
        assert [actors_on(n, "RayWorkerProc") for n in (a, b)] == [1, 1]
    finally:
        _stop(server, a)


def test_readme_server_then_a_node_lost_mid_request(cluster, tiny_models, tmp_path):
    """The README's server (TP=2 within a node, PP=2 across): HF's tokens with two workers on
    each node. Then node 2 dies while a streamed request runs: the client gets an error
    event within seconds and the head's log names the dead worker (vLLM's remote response
    wait alone hung until VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s)."""
    hosts, recipe, serve = cluster
    a, b = hosts.nodes
    model = tiny_models["llama"]
    log = tmp_path / "serve.log"
    server = recipe.start(serve, f"--host {a.ip} {SERVE_ARGS}", log)
    try:
        wait_healthy(a, PORT, server, log)
        prompts = [random_prompt(70 + i, 20 + 40 * i, vocab(model)) for i in range(2)]
        assert complete_on(a, prompts, 12) == [hf_greedy(model, p, 12) for p in prompts]
        assert [actors_on(n, "RayWorkerProc") for n in (a, b)] == [2, 2]

        started = tmp_path / "streaming"
        out: dict = {}
        request = {"prompt": prompts[0], "max_tokens": 400, "timeout": 200,
                   "signal_after": 3, "signal_file": str(started)}
        reader = threading.Thread(target=lambda: out.update(
            res=client(a, PORT, "stream", json.dumps(request))))
        reader.start()
        deadline = time.time() + 120
        while not started.exists() and reader.is_alive() and time.time() < deadline:
            time.sleep(0.1)
        assert started.exists(), "the stream never started"
        b.kill_all()
        reader.join(timeout=250)
        assert not reader.is_alive()
        result = json.loads(out["res"].stdout.strip().splitlines()[-1])
        assert result["chunks"] >= 3 and result["error"] is not None, result
        assert "InternalServerError" in result["error"] or "Error" in result["error"], result
        assert "Read timed out" not in result["error"], result
        text = log.read_text()
        assert "died unexpectedly, shutting down executor" in text
        assert "a Ray worker of this engine died" in text
    finally:
        _stop(server, a)
