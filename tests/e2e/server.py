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


def vllm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # real serving layout: engine processes
    return out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(vllm_cmd(*args), capture_output=True, text=True, timeout=300,
                          env=env())


@contextlib.contextmanager
def serve(model: str, log_dir: Path, *args: str):
    """Yield the server's base URL once /health answers; stop it afterwards."""
    port = free_port()
    log = log_dir / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            vllm_cmd(model, "--device", "npu", "--host", "127.0.0.1", "--port", str(port),
                     "--served-model-name", "tiny", *args),
            stdout=out, stderr=subprocess.STDOUT, env=env())
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
