"""The PD router as clients use it: the official openai client and `vllm bench serve` against
`vllm_npu.disagg.launch`'s router, its /health, /metrics and request ids; and faults that must
lose nothing (a client gone, a request past its timeout, the router restarted, a decode
instance killed mid-stream). After each, every surviving instance is idle (0 running, 0
waiting, no KV block held) and the deployment gives HF's greedy tokens as before.

One deployment for the module: the tiny Llama, one prefill and two decode instances (TP=1),
vLLM's default block size and batch settings apart from the KV cache's size; the decode kill
is the last test.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import requests

from tests.helpers.engine import vocab
from tests.helpers.pd import busy, metric, wait_idle
from tests.helpers.reference import hf_greedy, random_prompt
from tests.helpers.server import FORK
from vllm_npu.disagg.launch import PDCluster, free_port

TOKENS = 12
ABORT_S = 20  # VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT here: a prefill's unpulled blocks' lifetime
SERVE = ["--max-model-len", "2048", "--seed", "0", "--enable-log-requests",
         "--kv-cache-memory-bytes", str(128 << 20)]
LONG = 1600  # tokens: a request that runs for seconds (2.7 s here; prompts stay under 400)


@pytest.fixture(scope="module")
def pd(tiny_models, parity_dtype, tmp_path_factory):
    path = tiny_models["llama"]
    c = PDCluster(path, prefill_tp=(1,), decode_tp=(1, 1),
                  serve_args=["--dtype", parity_dtype, *SERVE],
                  log_dir=tmp_path_factory.mktemp("pd-serving"),
                  env={**FORK, "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": str(ABORT_S)},
                  router_args=["--health-interval-s", "1"])
    with c:
        yield c, path


def instances(c: PDCluster) -> list[str]:
    return [i.url for i in c.prefills + c.decodes if i.alive()]


def router_count(c: PDCluster, outcome: str) -> float:
    return metric(c.url, "vllm_npu_router_requests_total", outcome=outcome)


def client(c: PDCluster, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{c.url}/v1", api_key="none", max_retries=0, **kw)


def greedy(oa: openai.OpenAI, path: str, prompt: list[int], **kw):
    return oa.completions.create(model=path, prompt=prompt, max_tokens=TOKENS,
                                 temperature=0, extra_body={"ignore_eos": True,
                                                            "return_token_ids": True}, **kw)


def test_openai_client_models_completions_and_chat(pd):
    c, path = pd
    oa = client(c)
    assert [m.id for m in oa.models.list()] == [path]
    ids = requests.post(f"{c.url}/tokenize", json={"model": path, "prompt": "a router"},
                        timeout=30).json()["tokens"]
    assert requests.post(f"{c.url}/detokenize", json={"model": path, "tokens": ids},
                         timeout=30).json()["prompt"] == "a router"
    prompt = random_prompt(1, 40, vocab(path))
    want = hf_greedy(path, prompt, TOKENS)
    done = greedy(oa, path, prompt, extra_headers={"X-Request-Id": "pd-req-1"})
    assert done.choices[0].token_ids == want
    assert done.id == "cmpl-pd-req-1"
    # The same id reached both halves (vLLM logs "Added request cmpl-pd-req-1...").
    logged = [inst for inst in (*c.prefills, *c.decodes)
              if "Added request cmpl-pd-req-1" in inst.log.read_text()]
    assert len(logged) == 2 and logged[0] is c.prefills[0]
    streamed = greedy(oa, path, prompt, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == done.choices[0].text

    messages = [{"role": "user", "content": "What does the router do?"}]
    chat = oa.chat.completions.create(model=path, messages=messages, max_tokens=TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True,
                                                                 "return_token_ids": True})
    prompt_ids = chat.model_extra["prompt_token_ids"]
    assert chat.choices[0].model_extra["token_ids"] == hf_greedy(path, prompt_ids, TOKENS)
    pieces = oa.chat.completions.create(model=path, messages=messages, max_tokens=TOKENS,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True})
    chunks = list(pieces)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == TOKENS
    wait_idle(instances(c))


def test_vllm_bench_serve_against_the_router(pd, tmp_path):
    """`vllm bench serve` as documented, with no --model: it asks the router's /v1/models."""
    c, path = pd
    ok_before = router_count(c, "ok")
    res = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend",
         "vllm", "--base-url", c.url, "--dataset-name", "random", "--random-input-len", "64",
         "--random-output-len", "16", "--num-prompts", "16", "--ignore-eos",
         "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (result["completed"], result["failed"]) == (16, 0), res.stdout[-3000:]
    assert result["total_output_tokens"] == 16 * 16
    assert "/tokenize unavailable" not in res.stdout + res.stderr   # the router forwards it
    assert router_count(c, "ok") - ok_before >= 16   # the bench's and its test request
    wait_idle(instances(c))


def test_health_and_metrics(pd):
    c, _ = pd
    health = requests.get(f"{c.url}/health", timeout=30)
    assert health.status_code == 200
    assert health.json() == {"prefill": {c.prefills[0].url: "up"},
                             "decode": {d.url: "up" for d in c.decodes}}
    text = requests.get(f"{c.url}/metrics", timeout=30).text
    for d in c.decodes:
        assert f'vllm_npu_router_instance_up{{instance="{d.url}",role="decode"}} 1.0' in text
    assert metric(c.url, "vllm_npu_router_requests_in_flight") == 0
    assert metric(c.url, "vllm_npu_router_request_seconds_count") == \
        metric(c.url, "vllm_npu_router_requests_total")
    assert metric(c.url, "vllm_npu_router_first_byte_seconds_count") >= router_count(c, "ok")
    bad = requests.post(f"{c.url}/v1/completions", data=b"{not json", timeout=30)
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    assert router_count(c, "bad_request") >= 1


def test_a_request_whose_first_token_stops_it(pd):
    """The prefill half's one token may be a stop token or stop string of the request: vLLM's
    Mooncake producer then sent no KV and the decode half waited 480 s (the router strips
    what ends the prefill half early). Here the first greedy token is the stop token, or its
    text the stop string: the request ends at once with finish_reason 'stop', no text."""
    c, path = pd
    prompt = random_prompt(3, 30, vocab(path))
    first = hf_greedy(path, prompt, 1)[0]
    text = requests.post(f"{c.url}/detokenize", json={"model": path, "tokens": [first]},
                         timeout=30).json()["prompt"]
    for stop in ({"stop_token_ids": [first]}, {"stop": [text]} if text.strip() else {}):
        if not stop:
            continue
        reply = requests.post(f"{c.url}/v1/completions", timeout=60, json={
            "model": path, "prompt": prompt, "max_tokens": 8, "temperature": 0, **stop})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["finish_reason"] == "stop", (stop, reply.json())
        assert reply.json()["choices"][0]["text"] == ""
    wait_idle(instances(c))


def test_back_to_back_streams_read_to_their_end(pd):
    """Two clients, each sending streams it reads to `data: [DONE]` and then leaves, and
    plain requests, back to back. The router closed the socket of a stream its client had
    left, sometimes after httpx had put that connection back in its pool: the next request
    sent on it failed (ReadError, 58 of 579 in 45 s). Every request must be answered."""
    c, path = pd

    def one_client(seed: int) -> list[int]:
        statuses = []
        with httpx.Client(timeout=60) as http:
            for i in range(24):
                body = {"model": path, "prompt": random_prompt(seed * 100 + i, 12, vocab(path)),
                        "max_tokens": 4, "temperature": 0}
                if i % 2:
                    statuses.append(http.post(f"{c.url}/v1/completions", json=body).status_code)
                    continue
                with http.stream("POST", f"{c.url}/v1/completions",
                                 json={**body, "stream": True}) as reply:
                    statuses.append(reply.status_code)
                    for line in reply.iter_lines():
                        if line == "data: [DONE]":
                            break
        return statuses

    with cf.ThreadPoolExecutor(2) as pool:
        statuses = [s for got in pool.map(one_client, (1, 2)) for s in got]
    assert statuses == [200] * 48
    wait_idle(instances(c))


def _generated(c: PDCluster) -> float:
    return sum(metric(d.url, "vllm:generation_tokens_total") for d in c.decodes)


def test_a_client_gone_aborts_the_request_on_both_sides(pd):
    c, path = pd
    prompt = random_prompt(2, 300, vocab(path))
    body = {"model": path, "prompt": prompt, "max_tokens": LONG, "temperature": 0,
            "ignore_eos": True}
    # A stream, left after a few chunks while the decode instance is generating.
    generated = _generated(c)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{c.url}/v1/completions", json={**body, "stream": True}) \
                as reply:
            for n, _ in enumerate(reply.iter_lines()):
                if n == 8:
                    break
    took = wait_idle(instances(c), timeout_s=ABORT_S / 2)
    assert _generated(c) - generated < LONG, "the stream ran to its end: not aborted"
    # A non-streaming request, left while it runs.
    generated = _generated(c)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{c.url}/v1/completions", json=body, timeout=0.5)
    took = max(took, wait_idle(instances(c), timeout_s=ABORT_S / 2))
    assert _generated(c) - generated < LONG, "the request ran to its end: not aborted"
    deadline = time.time() + 10
    while router_count(c, "client_disconnected") < 2:
        assert time.time() < deadline, "the router did not count the disconnects"
        time.sleep(0.2)
    assert metric(c.url, "vllm_npu_router_requests_in_flight") == 0
    assert took < ABORT_S / 2


def test_request_timeout_is_a_504_and_frees_both_sides(pd):
    """A second router on the same instances, with --request-timeout-s 0.5."""
    c, path = pd
    port = free_port()
    cmd = c.router_cmd(port, ["--request-timeout-s", "0.5"])
    log = c.log_dir / "proxy-timeout.log"
    with open(log, "w") as out:
        router = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert router.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.5)
        body = {"model": path, "prompt": random_prompt(3, 200, vocab(path)),
                "max_tokens": LONG, "temperature": 0, "ignore_eos": True}
        reply = requests.post(f"{url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 504, reply.text
        assert "--request-timeout-s 0.5" in reply.json()["error"]["message"]
        # A stream: a 504 if it times out before its first token, else an error event.
        reply = requests.post(f"{url}/v1/completions", json={**body, "stream": True},
                              timeout=60)
        if reply.status_code != 504:
            events = [ln for ln in reply.text.splitlines() if ln.startswith("data: {")]
            assert json.loads(events[-1][6:])["error"]["code"] == 504, reply.text[-2000:]
            assert reply.text.rstrip().endswith("data: [DONE]")
        wait_idle(instances(c), timeout_s=ABORT_S / 2)
        assert metric(url, "vllm_npu_router_requests_total", outcome="timeout") == 2
    finally:
        router.kill()
        router.wait()


def test_router_restarted_while_serving(pd):
    c, path = pd
    prompt = random_prompt(4, 60, vocab(path))
    want = greedy(client(c), path, prompt).choices[0].token_ids
    body = {"model": path, "prompt": prompt, "max_tokens": LONG, "temperature": 0,
            "ignore_eos": True, "stream": True}
    errors: list[BaseException] = []
    ended: list[float] = []  # when streams that were not cut reached their end
    started = [threading.Event() for _ in range(3)]

    def stream(i: int) -> None:
        try:
            with httpx.stream("POST", f"{c.url}/v1/completions", json=body,
                              timeout=60) as reply:
                for _ in reply.iter_lines():
                    started[i].set()  # decoding: the stream runs for seconds more
            ended.append(time.time())
        except httpx.HTTPError as e:
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in started), "the streams never ran"
        killed = time.time()
        c.kill(c.router)
        for t in threads:
            t.join(timeout=60)
        # each stream still running was cut (one may have ended before the last started)
        assert errors and len(errors) + len(ended) == 3, (errors, ended)
        assert all(t < killed for t in ended), (ended, killed)
        wait_idle(instances(c), timeout_s=ABORT_S / 2)
    finally:  # the module's later tests need a router
        if not c.router.alive():
            c.start_router()
    assert greedy(client(c), path, prompt).choices[0].token_ids == want
    wait_idle(instances(c))


def test_decode_killed_mid_stream(pd):
    """Streams on both decode instances; one instance is killed: its clients get an error
    event, the others finish with HF's tokens, the prefill instance frees every block within
    its abort timeout, and later requests all go to the live decode instance."""
    c, path = pd
    v = vocab(path)
    prompts = [random_prompt(50 + i, 100 + 30 * i, v) for i in range(6)]
    length = 1000
    dead, live = c.decodes
    oa = client(c, timeout=120)
    seen: dict[int, list] = {}
    started = threading.Event()

    def stream(i: int) -> None:
        out = seen.setdefault(i, [])
        try:
            for ch in oa.completions.create(model=path, prompt=prompts[i],
                                            max_tokens=length,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True,
                                                        "return_token_ids": True}):
                out += ch.choices[0].token_ids or []
                if len(out) >= 4:
                    started.set()
        except openai.APIError as e:
            out.append(e)

    with cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(stream, i) for i in range(6)]
        assert started.wait(60)
        deadline = time.time() + 60
        while busy(dead.url)[1] == 0:
            assert time.time() < deadline, "nothing ran on the decode instance to kill"
            time.sleep(0.05)
        c.kill(dead)
        for f in futures:
            f.result(timeout=300)
    failed = [i for i, out in seen.items() if out and isinstance(out[-1], openai.APIError)]
    finished = [i for i in seen if i not in failed]
    assert failed and finished, seen
    for i in failed:
        assert dead.url in str(seen[i][-1])
    for i in finished:
        assert len(seen[i]) == length and seen[i][:48] == hf_greedy(path, prompts[i], 48)
    wait_idle([c.prefills[0].url, live.url], timeout_s=ABORT_S + 30)
    # the router's health loop (every 2 s, each round as slow as its slowest answer, 10 s
    # at most) marks the dead instance down at its first refused connection
    want, deadline = {dead.url: "down", live.url: "up"}, time.time() + 30
    while (state := requests.get(f"{c.url}/health", timeout=30).json()["decode"]) != want \
            and time.time() < deadline:
        time.sleep(0.5)
    assert state == want
    for p in prompts[:3]:
        assert greedy(client(c), path, p).choices[0].token_ids == hf_greedy(path, p, TOKENS)
    wait_idle(instances(c))
