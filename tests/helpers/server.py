"""Start `vllm serve --device npu` on 127.0.0.1 for a test, and run the CLI."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from vllm_npu.disagg.launch import free_port

STARTUP_S = 300
# vLLM's CLI starts engine cores and workers with spawn unless told otherwise
# (vllm/entrypoints/common/startup.py), so each re-imports vLLM: ~12 s of CPU per process on
# a 2-core host, most of a DP=2 server's startup. On the simulated NPU the parent holds no
# device context, so served tests fork (DP=2 + EP serving: 87 -> 38 s). test_server.py keeps
# the CLI's default, so the spawn path users get stays covered.
FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


def vllm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = dict(os.environ)
    out.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # real serving layout: engine processes
    out.pop("VLLM_WORKER_MULTIPROC_METHOD", None)  # the CLI's default unless `extra` sets it
    return {**out, **(extra or {})}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(vllm_cmd(*args), capture_output=True, text=True, timeout=300,
                          env=env())


@contextlib.contextmanager
def serve(model: str, log_dir: Path, *args: str, extra_env: dict[str, str] | None = FORK):
    """Yield the server's base URL once /health answers; stop it afterwards."""
    port = free_port()
    log = log_dir / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            vllm_cmd(model, "--device", "npu", "--host", "127.0.0.1", "--port", str(port),
                     "--served-model-name", "tiny", *args),
            stdout=out, stderr=subprocess.STDOUT, env=env(extra_env))
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + STARTUP_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n"
                            f"{log.read_text()[-4000:]}")
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if time.time() > deadline:
                pytest.fail(f"vllm serve not healthy after {STARTUP_S}s:\n"
                            f"{log.read_text()[-4000:]}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def complete(base: str, prompt: list[int], max_tokens: int) -> list[int]:
    r = requests.post(f"{base}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]
