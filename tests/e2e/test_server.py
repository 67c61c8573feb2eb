"""`vllm serve MODEL --device npu` over HTTP on 127.0.0.1: completions, chat, streaming,
all token-for-token against HF transformers; and the CLI's startup refusals."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.e2e.engine import vocab as _vocab
from tests.e2e.reference import hf_greedy, random_prompt

STARTUP_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the real serving layout: engine core process
    return env


@pytest.fixture(scope="module")
def server(tiny_models, parity_dtype, tmp_path_factory):
    path = tiny_models["llama"]
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            _vllm_cmd(path, "--device", "npu", "--host", "127.0.0.1", "--port", str(port),
                      "--dtype", parity_dtype, "--max-model-len", "1024", "--seed", "0",
                      "--served-model-name", "tiny"),
            stdout=out, stderr=subprocess.STDOUT, env=_env())
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + STARTUP_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve not healthy after {STARTUP_S}s:\n"
                            f"{log.read_text()[-4000:]}")
            time.sleep(1)
        yield base, path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_completions_match_hf(server):
    base, path = server
    for seed, length in ((1, 7), (2, 140)):
        prompt = random_prompt(seed, length, _vocab(path))
        r = requests.post(f"{base}/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True})
        r.raise_for_status()
        assert r.json()["choices"][0]["token_ids"] == hf_greedy(path, prompt, 16)


def test_chat_completions_match_hf(server):
    from transformers import AutoTokenizer

    base, path = server
    messages = [{"role": "user", "content": "hello world the npu runs vllm"}]
    r = requests.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})
    r.raise_for_status()
    body = r.json()
    prompt = AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert body["prompt_token_ids"] == list(prompt)
    assert body["choices"][0]["token_ids"] == hf_greedy(path, list(prompt), 12)


def test_streaming_equals_non_streaming(server):
    base, path = server
    prompt = random_prompt(3, 20, _vocab(path))
    req = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
           "ignore_eos": True}
    full = requests.post(f"{base}/v1/completions", json=req, timeout=120).json()
    pieces = []
    with requests.post(f"{base}/v1/completions", json=req | {"stream": True}, stream=True,
                       timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert len(pieces) >= 2  # really streamed, not one blob
    assert "".join(pieces) == full["choices"][0]["text"]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(_vllm_cmd(*args), capture_output=True, text=True, timeout=300,
                          env=_env())


def test_device_other_than_npu_is_refused(tiny_models):
    res = _run_cli(tiny_models["llama"], "--device", "cuda")
    assert res.returncode != 0
    assert "--device 'cuda' is not available" in res.stderr
    assert "only --device npu" in res.stderr


def test_bad_additional_config_is_refused_at_startup(tiny_models):
    res = _run_cli(tiny_models["llama"], "--device", "npu", "--additional-config",
                   '{"decode_attention_op": "flash"}')
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "decode_attention_op='flash'" in out
    assert "paged_attention" in out and "fused_infer_attention" in out
