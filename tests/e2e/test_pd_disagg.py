"""Prefill/decode disaggregation over Mooncake (TCP on loopback), served for real: `vllm serve
--device npu` prefill and decode instances, vLLM's MooncakeConnector (the NPU subclass), the
plugin's router; greedy tokens through the router against HF transformers (float32).

Four deployments, each started once for its test class (one alive at a time):
- Llama 2P1D: a TP=1 and a TP=2 prefill instance (heterogeneous TP: the decode side
  reorders the TP=2 producer's block slices), one decode instance. It also serves the
  prefix-cache, transfer-error and killed-prefill cases (the kill is the module's last test).
- Llama 1P1D with prefill TP=1 < decode TP=2, `kv_load_failure_policy=recompute`: the
  transfer is refused with its reason and the decode side recomputes.
- DeepSeek-V3-style MLA and DeepSeek-V3.2 (latent cache + indexer keys) 1P1D, prefill
  TP=2 -> decode TP=1 (both caches are replicated).
"""
from __future__ import annotations

import concurrent.futures as cf
import re
import threading
import time
import uuid

import pytest
import requests

from tests.helpers.engine import vocab
from tests.helpers.pd import metric, wait_idle
from tests.helpers.reference import hf_greedy, random_prompt
from tests.helpers.server import FORK
from vllm_npu.disagg.launch import PDCluster

TOKENS = 12
# Every instance holds a simulated KV cache in host memory: 128 MiB each, not the default
# 0.92 x NPU_SIM_MEMORY_GB (3.7 GiB), or a few deployments exhaust a 24 GiB machine.
SERVE = ["--max-model-len", "1024", "--max-num-seqs", "16", "--seed", "0",
         "--kv-cache-memory-bytes", str(128 << 20)]
DEAD_PEER_BOUND_S = 30  # probes 2 s apart x 3 misses, plus a loaded 2-core machine


def sources(url: str) -> dict[str, float]:
    return {s: metric(url, "vllm:prompt_tokens_by_source_total", source=s)
            for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def ask(url: str, prompt: list[int], model: str, max_tokens: int = TOKENS,
        **extra) -> requests.Response:
    return requests.post(f"{url}/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, **extra})


_LOG_DIRS: list = []  # the live deployment's log folder, for failure messages
_WORTH_SHOWING = re.compile(r"ERROR|[Ff]ailed|Retrying|probes|Timeout|LAYOUT")


def log_excerpt(lines: int = 40) -> str:
    """The instances' error and transfer-failure lines, so a failure in CI says why."""
    out = []
    for d in _LOG_DIRS[-1:]:
        for log in sorted(d.glob("*.log")):
            hits = [ln for ln in log.read_text(errors="replace").splitlines()
                    if _WORTH_SHOWING.search(ln)]
            out += [f"--- {log.name}"] + hits[-lines:]
    return "\n".join(out)


def tokens(reply: requests.Response) -> list[int]:
    assert reply.status_code == 200, f"{reply.text}\n{log_excerpt()}"
    return reply.json()["choices"][0]["token_ids"]


def cluster(model: str, log_dir, dtype: str, **kw) -> PDCluster:
    _LOG_DIRS.append(log_dir)
    return PDCluster(model, serve_args=["--dtype", dtype, *SERVE], log_dir=log_dir,
                     env=FORK, **kw)


def _pull(c: PDCluster, prefill, engine_id: str, prompt, model) -> requests.Response:
    """Ask the decode instance for a request whose KV `prefill` is to send (the router's
    decode half, without its prefill half)."""
    return ask(c.decodes[0].url, prompt, model, kv_transfer_params={
        "do_remote_prefill": True, "remote_engine_id": engine_id,
        "remote_bootstrap_addr": f"http://127.0.0.1:{prefill.bootstrap_port}",
        "transfer_id": f"xfer-{uuid.uuid4().hex}"})


@pytest.fixture(scope="class")
def llama_2p1d(tiny_models, parity_dtype, tmp_path_factory):
    path = tiny_models["llama"]
    with cluster(path, tmp_path_factory.mktemp("pd-2p1d"), parity_dtype,
                 prefill_tp=(1, 2), decode_tp=(1,)) as c:
        yield c, path


class TestLlama2P1D:
    """TP=1 and TP=2 prefill instances, one decode instance."""

    def test_2p1d_concurrent_requests_match_hf_with_kv_from_the_connector(self, llama_2p1d):
        c, path = llama_2p1d
        v = vocab(path)
        prompts = [random_prompt(100 + i, 5 + 19 * i, v) for i in range(16)]
        decode = c.decodes[0].url
        d0 = sources(decode)
        p0 = [metric(p.url, "vllm:prompt_tokens_total") for p in c.prefills]
        with cf.ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda p: ask(c.url, p, path), prompts))
        assert [tokens(r) for r in replies] == [hf_greedy(path, p, TOKENS) for p in prompts]
        # Every prompt token on the decode side came over the connector.
        assert delta(sources(decode), d0) == {
            "local_compute": 0, "local_cache_hit": 0,
            "external_kv_transfer": sum(map(len, prompts))}
        # Both prefill instances (TP=1 and TP=2) computed prompts.
        grew = [metric(p.url, "vllm:prompt_tokens_total") - b for p, b in zip(c.prefills, p0)]
        assert min(grew) > 0 and sum(grew) == sum(map(len, prompts))
        wait_idle([p.url for p in c.prefills] + [decode])

    def test_decode_side_prefix_cache_hits(self, llama_2p1d):
        """A prompt the decode side has cached, whole blocks of it: those come from its own
        prefix cache, only the rest over the connector; tokens stay HF's."""
        c, path = llama_2p1d
        decode = c.decodes[0].url
        prompt = random_prompt(7, 300, vocab(path))         # 2 full 128-token blocks + 44
        want = hf_greedy(path, prompt, TOKENS)
        assert tokens(ask(c.url, prompt, path)) == want
        before = sources(decode)
        for _ in range(2):                                  # both prefill instances in turn
            assert tokens(ask(c.url, prompt, path)) == want
        assert delta(sources(decode), before) == {
            "local_compute": 0, "local_cache_hit": 2 * 256, "external_kv_transfer": 2 * 44}
        longer = prompt + random_prompt(8, 100, vocab(path))
        assert tokens(ask(c.url, longer, path)) == hf_greedy(path, longer, TOKENS)
        wait_idle([p.url for p in c.prefills] + [decode])

    def test_a_transfer_error_fails_only_that_request(self, llama_2p1d):
        c, path = llama_2p1d
        prompt = random_prompt(9, 50, vocab(path))
        t0 = time.time()
        reply = _pull(c, c.prefills[0], "no-such-engine", prompt, path)
        assert reply.status_code == 500 and time.time() - t0 < 30
        log = c.decodes[0].log.read_text()
        assert "remote engine_id no-such-engine not found from bootstrap server" in log
        wait_idle([c.decodes[0].url])
        assert tokens(ask(c.url, prompt, path)) == hf_greedy(path, prompt, TOKENS)

    def test_prefill_killed_during_a_transfer(self, llama_2p1d):
        """The decode side waits for KV a prefill instance holds; the instance is killed; the
        request fails within the probe bound, its blocks are freed, and the deployment keeps
        serving through the other prefill instance (the router marks the dead one down)."""
        c, path = llama_2p1d
        dead, live = c.prefills
        decode = c.decodes[0].url
        engine_id = requests.get(f"http://127.0.0.1:{dead.bootstrap_port}/query",
                                 timeout=30).json()["0"]["engine_id"]
        prompt = random_prompt(10, 200, vocab(path))
        result: dict = {}
        waiting = threading.Thread(target=lambda: result.update(
            reply=_pull(c, dead, engine_id, prompt, path), at=time.time()))
        waiting.start()
        deadline = time.time() + 60
        while metric(decode, "vllm:kv_cache_usage_perc") == 0:   # the pull holds its blocks
            assert time.time() < deadline, "the decode side never allocated the pull's blocks"
            time.sleep(0.2)
        killed = time.time()
        c.kill(dead)
        waiting.join(timeout=120)
        assert result["reply"].status_code == 500
        assert result["at"] - killed < DEAD_PEER_BOUND_S
        assert "stopped accepting connections" in c.decodes[0].log.read_text()
        wait_idle([decode])
        # The router marks the dead instance down (a refused connection, or its /health
        # poll) and sends every request to the live one: round robin no longer reaches it.
        replies = [ask(c.url, prompt, path) for _ in range(3)]
        assert [tokens(r) for r in replies] == [hf_greedy(path, prompt, TOKENS)] * 3
        state = requests.get(f"{c.url}/health", timeout=30).json()["prefill"]
        assert state == {dead.url: "down", live.url: "up"}
        wait_idle([live.url, decode])


@pytest.fixture(scope="class")
def llama_decode_tp2(tiny_models, parity_dtype, tmp_path_factory):
    path = tiny_models["llama"]
    with cluster(path, tmp_path_factory.mktemp("pd-dtp2"), parity_dtype,
                 prefill_tp=(1,), decode_tp=(2,), load_failure_policy="recompute") as c:
        yield c, path


class TestPrefillTPBelowDecodeTP:
    """Prefill TP=1 -> decode TP=2, kv_load_failure_policy=recompute."""

    def test_prefill_tp_below_decode_tp_is_refused_and_recomputed(self, llama_decode_tp2):
        c, path = llama_decode_tp2
        decode = c.decodes[0].url
        prompts = [random_prompt(20 + i, 30 + 40 * i, vocab(path)) for i in range(3)]
        before = sources(decode)
        assert [tokens(ask(c.url, p, path)) for p in prompts] == \
            [hf_greedy(path, p, TOKENS) for p in prompts]
        assert delta(sources(decode), before) == {
            "local_compute": sum(map(len, prompts)), "local_cache_hit": 0,
            "external_kv_transfer": 0}
        assert ("the prefill instance runs tensor parallel size 1 and this decode instance 2"
                in c.decodes[0].log.read_text())
        wait_idle([c.prefills[0].url, decode])


@pytest.fixture(scope="class", params=["deepseek_v3", "deepseek_v32"])
def mla_p_tp2(request, parity_dtype, tmp_path_factory):
    """DeepSeek-V3-style MLA (latent 512 + 64, nope / value 32), and DeepSeek-V3.2, whose
    indexer keys (picking 16 keys per token: every prompt here attends sparsely) sit in the
    pool beside the latent cache and must travel with it."""
    from vllm_npu.testing.tiny_archs import build_tiny_arch
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp(f"pd-{request.param}")
    path = build_tiny_arch(str(root / "model"), request.param) \
        if request.param == "deepseek_v32" else \
        build_tiny_model(str(root / "model"), arch=request.param)
    with cluster(path, tmp_path_factory.mktemp("pd-mla-logs"), parity_dtype,
                 prefill_tp=(2,), decode_tp=(1,)) as c:
        yield c, path


def _hf(path: str, prompt: list[int]) -> list[int]:
    return hf_greedy(path, prompt, TOKENS, attn_implementation="eager")


class TestMLA:
    """MLA models, prefill TP=2 -> decode TP=1 (the latent cache is replicated)."""

    def test_mla_latent_cache_over_the_connector(self, mla_p_tp2):
        c, path = mla_p_tp2
        decode = c.decodes[0].url
        prompts = [random_prompt(30 + i, 9 + 37 * i, vocab(path)) for i in range(8)]
        before = sources(decode)
        with cf.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda p: ask(c.url, p, path), prompts))
        assert [tokens(r) for r in replies] == [_hf(path, p) for p in prompts]
        assert delta(sources(decode), before) == {
            "local_compute": 0, "local_cache_hit": 0,
            "external_kv_transfer": sum(map(len, prompts))}
        # A repeat: its first full block from the decode side's own cache.
        assert tokens(ask(c.url, prompts[-1], path)) == _hf(path, prompts[-1])
        assert sources(decode)["local_cache_hit"] - before["local_cache_hit"] == 256
        wait_idle([c.prefills[0].url, decode])
