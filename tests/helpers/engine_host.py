"""A separate Python process that runs the tests' multi-worker engines.

The test process initialises the (simulated) NPU in its first in-process engine, so the
platform then spawns the TP workers of its later engines (vllm_npu/fork_safety.py, as a
device requires): each spawned worker imports vLLM again, ~12 s of CPU. The host is a
fresh interpreter that never initialises the NPU itself: its engine cores run in its own
process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and their workers fork from it, as `vllm
serve`'s engine core forks its workers. It keeps only what engines leave, not the test
process's HF references and caches, so forked workers stay small.

    with EngineHost() as host:
        tokens = host.generate(path, prompts, 12, tensor_parallel_size=2, ...)
        result = host.run(fn, *args, env={...}, **kwargs)  # fn: a module-level function
        mark = host.log_offset(); ...; host.log_since(mark)  # what the host and workers logged

Only engines whose workers are other processes belong here (TP/PP/CP > 1): a
single-device engine would initialise the NPU in the host, and later workers would spawn.
Calls go over a loopback connection (functions by reference, pickled); an error comes
back as EngineHostError with the host's traceback, and the host keeps serving.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from multiprocessing.connection import Client, Listener
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class EngineHostError(RuntimeError):
    pass


class EngineHost:
    def __init__(self, log: Path | None = None) -> None:
        key = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", _ENGINE_HOST_KEY=key.hex(),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                            env.get("PYTHONPATH")])))
        self._log = log
        out = open(log, "w") if log is not None else None
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.engine_host",
             "%s:%d" % self._listener.address], cwd=ROOT, env=env,
            stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self._conn = self._listener.accept()

    def run(self, fn, *args, env: dict[str, str] | None = None, **kwargs):
        """fn(*args, **kwargs) in the host, with `env` set there for the call."""
        self._conn.send((fn, args, kwargs, env or {}))
        status, value = self._conn.recv()
        if status != "ok":
            raise EngineHostError(value)
        return value

    def log_offset(self) -> int:
        """Where the host's log ends now (0 without a log)."""
        return self._log.stat().st_size if self._log is not None else 0

    def log_since(self, offset: int) -> str:
        """What the host and its workers logged after ``offset`` (their log handlers flush
        each record)."""
        if self._log is None:
            raise EngineHostError("this engine host was started without a log")
        with open(self._log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def generate(self, path: str, prompts: list[list[int]], max_tokens: int,
                 **llm_kwargs) -> list[list[int]]:
        """Greedy tokens of an engine made for this call (LLM(path, **llm_kwargs))."""
        return self.run(generate_once, path, prompts, max_tokens, **llm_kwargs)

    def close(self) -> None:
        try:
            self._conn.send(None)
            self._proc.wait(timeout=60)
        except Exception:
            self._proc.kill()
        finally:
            self._conn.close()
            self._listener.close()

    def __enter__(self) -> "EngineHost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def generate_once(path, prompts, max_tokens, **llm_kwargs):
    from vllm import LLM

    from tests.helpers.engine import generate, shutdown

    llm = LLM(path, **llm_kwargs)
    try:
        return generate(llm, prompts, max_tokens)
    finally:
        shutdown(llm)


def generate_with_make_llm(path, dtype, prompts, max_tokens, **overrides):
    """As generate_once, with the e2e tests' small-engine defaults (engine.make_llm)."""
    from tests.helpers.engine import generate, make_llm, shutdown

    llm = make_llm(path, dtype, **overrides)
    try:
        return generate(llm, prompts, max_tokens)
    finally:
        shutdown(llm)


def _serve(address: str) -> None:
    import pickle
    import traceback

    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["_ENGINE_HOST_KEY"]))
    while True:
        data = conn.recv_bytes()
        try:
            msg = pickle.loads(data)
        except Exception:  # a function the host cannot import
            conn.send(("error", traceback.format_exc()))
            continue
        if msg is None:
            break
        fn, args, kwargs, env = msg
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            conn.send(("ok", fn(*args, **kwargs)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


if __name__ == "__main__":
    _serve(sys.argv[1])
