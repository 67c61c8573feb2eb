"""The PD-disaggregation parts that need no server: the heterogeneous-TP block reorder, the
MLA latent regions, the dead-peer watchdog, the connector config checks, the router."""
from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch

from vllm_npu.kv_layout import latent_planes
from vllm_npu.distributed.kv_transfer import config as kv_config
from vllm_npu.distributed.kv_transfer.liveness import PeerLost, probe, watch_peer
from vllm_npu.distributed.kv_transfer.mooncake import (
    NPUMooncakeConnectorWorker,
    reorder_split_blocks,
)
from vllm_npu.disagg.proxy import Prefiller, Router, build_app, parse_prefill


# ---- heterogeneous TP: producer slices -> the NPU block layout ----------------------------

@pytest.mark.parametrize("splits", [2, 4])
def test_reorder_restores_blocks_written_as_producer_slices(splits):
    """Producer rank r holds heads [r*h/s, (r+1)*h/s); the connector writes its whole block
    [bs, C/s] at byte offset r * (its block) inside the consumer's block. After the reorder
    the consumer's K plane equals the full-head cache; other blocks are untouched."""
    torch.manual_seed(0)
    nb, bs, heads, dim = 6, 8, 4, 3
    full = torch.randn(nb, bs, heads * dim)
    cache = torch.randn(nb, 2, bs, heads * dim)        # [num_blocks, K/V, bs, C] (backend)
    before = cache.clone()
    plane = cache[:, 0]                                 # a strided view, as in the runner
    received = [4, 1, 3]
    c = heads * dim // splits
    for b in received:
        flat = torch.empty(bs * heads * dim)
        for r in range(splits):
            flat[r * bs * c:(r + 1) * bs * c] = full[b, :, r * c:(r + 1) * c].reshape(-1)
        plane[b] = flat.view(bs, heads * dim)
    reorder_split_blocks(plane, received, splits)
    for b in range(nb):
        if b in received:
            assert torch.equal(cache[b, 0], full[b])
        else:
            assert torch.equal(cache[b, 0], before[b, 0])
    assert torch.equal(cache[:, 1], before[:, 1])      # the V plane is another call


def test_reorder_refuses_a_row_that_does_not_split():
    with pytest.raises(ValueError, match="row of 6 elements does not split into 4"):
        reorder_split_blocks(torch.zeros(2, 4, 6), [0], 4)


# ---- MLA: one layer's latent memory is two planes -> two regions per layer ---------------

def test_latent_regions_cover_both_planes_of_each_block():
    """After registration the worker's regions for a layer are the nope and rope planes;
    copying block b region by region (as the transfer engine does, by address) from one
    cache to another moves exactly block b's rows of both planes."""
    nb, bs, rank, rope = 5, 4, 6, 2
    src = torch.randn(nb, 1, bs, rank + rope)           # vLLM's [B, H, N, C] view
    dst = torch.zeros_like(src)
    class Registered(NPUMooncakeConnectorWorker):
        def __del__(self):  # no engine or sockets were made
            pass

    worker = object.__new__(Registered)
    worker.model_config = SimpleNamespace(hf_text_config=SimpleNamespace(
        kv_lora_rank=rank, qk_rope_head_dim=rope))

    def register(cache):   # what vLLM's registration leaves for one packed MLA layer
        worker.device_kv_caches = {"layers.0.attn": cache}
        worker.kv_caches_base_addr = [cache.data_ptr()]
        worker.block_len_per_layer = worker.kv_block_len_per_layer = [cache[0].nbytes]
        worker.registered_layer_names = ["layers.0.attn"]
        worker.registered_layer_indices, worker.registered_group_indices = [0], [0]
        worker.region_shared_groups, worker.region_row_offsets = [(0,)], [0]
        worker._split_latent_regions()
        return list(zip(worker.kv_caches_base_addr, worker.block_len_per_layer))

    src_regions, dst_regions = register(src), register(dst)
    assert worker.registered_layer_names == ["layers.0.attn"] * 2
    assert worker.region_row_offsets == [-1, -1]
    block = 3
    for (s, length), (d, _) in zip(src_regions, dst_regions):
        ctypes.memmove(d + block * length, s + block * length, length)
    for got, want in zip(latent_planes(dst.view(nb, bs, -1), rank),
                         latent_planes(src.view(nb, bs, -1), rank)):
        assert torch.equal(got[block], want[block])
        others = [b for b in range(nb) if b != block]
        assert not got[others].any()


# ---- a dead prefill worker fails the pull in seconds ----------------------------------------

def _listener() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_probe_sees_a_listener_and_a_closed_port():
    s, addr = _listener()
    assert asyncio.run(probe(addr, 1.0))
    s.close()
    assert not asyncio.run(probe(addr, 1.0))


async def _pull(seen: list, forever: bool = True):
    """Stands for vLLM's receive coroutine: waits on a reply, reports any Exception."""
    try:
        await (asyncio.get_running_loop().create_future() if forever else asyncio.sleep(0.05))
    except Exception as e:  # noqa: BLE001 - vLLM's handler catches Exception too
        seen.append(e)
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    else:
        seen.append("done")


def test_watch_peer_interrupts_a_pull_when_its_peer_dies():
    s, addr = _listener()
    seen: list = []

    async def scenario():
        asyncio.get_running_loop().call_later(0.3, s.close)
        t0 = time.monotonic()
        await watch_peer(_pull(seen), addr, interval_s=0.1, misses=2)
        return time.monotonic() - t0

    elapsed = asyncio.run(scenario())
    assert len(seen) == 1 and isinstance(seen[0], PeerLost)
    assert addr in str(seen[0]) and "2 probes 0.1 s apart failed" in str(seen[0])
    assert elapsed < 5.0


def test_watch_peer_leaves_a_live_peer_and_passes_a_real_cancel():
    s, addr = _listener()
    seen: list = []
    asyncio.run(watch_peer(_pull(seen, forever=False), addr, interval_s=0.01, misses=1))
    assert seen == ["done"]

    async def cancelled():
        task = asyncio.ensure_future(watch_peer(_pull(seen), addr, 0.05, 3))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    seen.clear()
    asyncio.run(cancelled())
    assert seen == ["cancelled"]
    s.close()


# ---- --kv-transfer-config checks at startup -------------------------------------------------

def _config(connector="MooncakeConnector", **extra):
    from vllm.config import KVTransferConfig

    kv = KVTransferConfig(kv_connector=connector, kv_role="kv_consumer",
                          kv_connector_extra_config=extra)
    return SimpleNamespace(kv_transfer_config=kv)


def test_mooncake_is_routed_to_the_npu_subclass_over_tcp():
    cfg = _config()
    kv_config.adopt_kv_transfer_config(cfg)
    kv = cfg.kv_transfer_config
    assert kv.kv_connector_module_path == "vllm_npu.distributed.kv_transfer.mooncake"
    assert kv.kv_connector_extra_config == {"mooncake_protocol": "tcp",
                                            "peer_probe_interval_s": 2.0,
                                            "peer_probe_misses": 3}
    other = _config("ExampleConnector")
    kv_config.adopt_kv_transfer_config(other)
    assert other.kv_transfer_config.kv_connector_module_path is None


@pytest.mark.parametrize("extra, message", [
    ({"mooncake_protocol": "rdma"},
     "mooncake_protocol 'rdma' does not run on the simulated NPU .*valid: \\['tcp'\\]"),
    ({"peer_probe_misses": 0}, "peer_probe_misses = 0: expected a positive int"),
    ({"peer_probe_misses": 1.5}, "peer_probe_misses = 1.5: expected a positive int"),
    ({"peer_probe_interval_s": "2"}, "peer_probe_interval_s = '2': expected a positive float"),
])
def test_bad_connector_settings_are_refused_at_startup(extra, message):
    with pytest.raises(ValueError, match=message):
        kv_config.adopt_kv_transfer_config(_config(**extra))


def test_a_missing_transfer_engine_names_the_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # import fails
    with pytest.raises(ValueError, match="pip install mooncake-transfer-engine-non-cuda"):
        kv_config.adopt_kv_transfer_config(_config())


def test_nixl_is_refused_when_the_engine_starts(tiny_models):
    """vLLM's NIXL worker registers no NPU memory: the engine stops while it sets up its KV
    cache, naming the connector that runs, not inside NIXL's own device code (on the
    simulated NPU that was a TypeError from the CPU platform's NUMA discovery)."""
    from vllm import LLM

    try:
        with pytest.raises(ValueError, match="kv_connector 'NixlConnector' does not run on "
                           "the NPU: NIXL registers no NPU memory.*MooncakeConnector"):
            LLM(tiny_models["llama"], enforce_eager=True, max_model_len=128,
                kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    finally:  # the engine stopped half-started, in this process: its groups stay behind
        from vllm.distributed import cleanup_dist_env_and_memory  # (as the plugin patched it)

        cleanup_dist_env_and_memory()


# ---- the router --------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    (["127.0.0.1:8100"], "expected http://host:port"),
    (["http://127.0.0.1:8100", "boot"], "bootstrap port 'boot'"),
    (["http://127.0.0.1:8100", "1", "2"], "URL \\[BOOTSTRAP_PORT\\]"),
])
def test_router_refuses_bad_prefill_arguments(values, message):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_prefill(values)


def _router(prefill_status: int, decode_gate: asyncio.Event, log: list,
            refused: tuple[str, ...] = (), finish: str = "length", **kw) -> Router:
    """A router over mocked instances: prefill p:1 (bootstrap p:2), q:1 (q:2) when `refused`
    names p:1, decode d:3; a host in `refused` refuses connections. A prefill's 200 ends
    its token with `finish`; the log holds each half's (url, kv_transfer_params,
    max_tokens, body)."""
    prefills = [Prefiller("http://p:1", bootstrap="http://p:2")]
    if refused:
        prefills.append(Prefiller("http://q:1", bootstrap="http://q:2"))
    router = Router(prefills, ["http://d:3"], wait_s=5, **kw)

    async def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url.endswith("/health"):
            return httpx.Response(200)
        if url.endswith(":2/query"):
            return httpx.Response(200, json={"0": {"engine_id": f"E-{request.url.host}",
                                                   "worker_addr": {}}})
        body = json.loads(request.content)
        if request.url.host in refused:
            log.append((url, "refused"))
            raise httpx.ConnectError("connection refused", request=request)
        log.append((url, body.get("kv_transfer_params"), body["max_tokens"], body))
        if url.startswith(("http://p:1", "http://q:1")):
            if refused:
                decode_gate.set()   # the decode half goes on once a prefill answered
            if prefill_status == 200:
                return httpx.Response(200, json={"choices": [{"finish_reason": finish}]})
            return httpx.Response(prefill_status, text="prompt too long")
        try:
            await decode_gate.wait()
        except asyncio.CancelledError:
            log.append("decode cancelled")
            raise
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    router.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return router


def test_router_pairs_prefill_and_decode_under_one_transfer_id():
    async def scenario():
        log: list = []
        gate = asyncio.Event()
        router = _router(200, gate, log)
        await router.discover()
        app = build_app(router)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://router") as client:
            call = asyncio.ensure_future(client.post("/v1/completions", json={
                "model": "m", "prompt": [1, 2], "max_tokens": 5}))
            await asyncio.sleep(0.1)
            gate.set()
            reply = await call
        return reply, log

    reply, log = asyncio.run(scenario())
    assert reply.status_code == 200 and reply.json() == {"choices": [{"text": "ok"}]}
    assert len(log) == 2
    prefill = next(x for x in log if x[0].startswith("http://p:1"))
    decode = next(x for x in log if x[0].startswith("http://d:3"))
    assert prefill[2] == 1 and decode[2] == 5
    assert prefill[1]["do_remote_decode"] and not decode[1]["do_remote_decode"]
    assert decode[1]["do_remote_prefill"] and decode[1]["remote_engine_id"] == "E-p"
    assert decode[1]["remote_bootstrap_addr"] == "http://p:2"
    assert prefill[1]["transfer_id"] == decode[1]["transfer_id"]


def _open() -> asyncio.Event:
    gate = asyncio.Event()
    gate.set()
    return gate


def test_nothing_ends_the_prefill_half_before_its_token_limit():
    """vLLM's Mooncake producer sends KV only for a request that ended at its token limit;
    one ended by EOS, a stop string or a grammar sends none and its decode half waited 480
    s (seen: a tiny model whose first token was EOS). The prefill half goes without the
    fields that can end it early and with min_tokens=1; the decode half keeps them all."""
    log: list = []
    reply, _ = _ask(_router(200, _open(), log), stop=["\n"], stop_token_ids=[7],
                    structured_outputs={"choice": ["a", "b"]})
    assert reply.status_code == 200
    prefill = next(x[3] for x in log if x[0].startswith("http://p:1"))
    decode = next(x[3] for x in log if x[0].startswith("http://d:3"))
    assert prefill["max_tokens"] == prefill["min_tokens"] == 1
    assert not {"stop", "stop_token_ids", "structured_outputs"} & prefill.keys()
    assert decode["stop"] == ["\n"] and decode["stop_token_ids"] == [7]
    assert decode["structured_outputs"] == {"choice": ["a", "b"]}


@pytest.mark.parametrize("fan_out", [{"n": 2}, {"best_of": 3}])
def test_a_request_of_several_samples_runs_whole_on_a_decode_instance(fan_out):
    """Each of a request's n samples would pull the one transfer, and the second waits for
    KV the prefill side no longer has: such a request goes to a decode instance whole,
    without kv_transfer_params, and no prefill instance sees it."""
    log: list = []
    reply, _ = _ask(_router(200, _open(), log), **fan_out)
    assert reply.status_code == 200
    assert [(url, params, tokens) for url, params, tokens, _ in log] == [
        ("http://d:3/v1/completions", None, 3)]
    assert fan_out.items() <= log[0][3].items()


def test_a_prefill_ended_early_fails_at_once():
    """A prefill half that still ends before its limit (finish_reason 'stop') sends no KV:
    the router answers 502 naming it and cancels the decode half, which would wait."""
    log: list = []
    reply, _ = _ask(_router(200, asyncio.Event(), log, finish="stop"))
    assert reply.status_code == 502
    assert reply.json()["error"]["message"] == (
        "prefill instance http://p:1 ended the request with finish_reason 'stop', not "
        "'length': it sends no KV")
    assert "decode cancelled" in log


@pytest.mark.parametrize("status, client_status", [(400, 400), (500, 502)])
def test_a_failed_prefill_cancels_the_decode_request(status, client_status):
    """A prefill instance's 4xx is the request's fault: the client gets it as it is; any
    other failure is the router's 502 naming the instance. Either way the decode half is
    cancelled."""
    async def scenario():
        log: list = []
        router = _router(status, asyncio.Event(), log)   # decode would wait forever
        await router.discover()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(build_app(router)),
                                     base_url="http://router") as client:
            reply = await asyncio.wait_for(client.post("/v1/completions", json={
                "model": "m", "prompt": [1], "max_tokens": 3}), 10)
        await asyncio.sleep(0.05)
        return reply, log

    reply, log = asyncio.run(scenario())
    assert reply.status_code == client_status
    if status == 400:
        assert reply.text == "prompt too long"
    else:
        assert reply.json()["error"]["message"] == ("prefill instance http://p:1 answered "
                                                    "500: prompt too long")
    assert "decode cancelled" in log


def _ask(router: Router, timeout_s: float = 10, **body) -> tuple[httpx.Response, Router]:
    async def scenario():
        await router.discover()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(build_app(router)),
                                     base_url="http://router") as client:
            reply = await asyncio.wait_for(client.post("/v1/completions", json={
                "model": "m", "prompt": [1], "max_tokens": 3, **body}), timeout_s)
            health = await client.get("/health")
        await asyncio.sleep(0.05)
        return reply, health

    return asyncio.run(scenario())


def test_a_prefill_instance_refusing_connections_is_marked_down_and_the_request_retried():
    log: list = []
    router = _router(200, asyncio.Event(), log, refused=("p",))
    reply, health = _ask(router)
    assert reply.status_code == 200 and reply.json() == {"choices": [{"text": "ok"}]}
    # p first (round robin), refused: its decode half cancelled, the request sent again
    # with q; p is down for the next requests until a /health poll finds it back.
    seen = [x if isinstance(x, str) else (x[0], x[1] if x[1] == "refused" else x[1][
        "remote_engine_id" if "d:3" in x[0] else "transfer_id"][:4]) for x in log]
    assert set(seen[:2]) == {("http://d:3/v1/completions", "E-p"),
                             ("http://p:1/v1/completions", "refused")}
    assert seen[2] == "decode cancelled"
    assert set(seen[3:]) == {("http://d:3/v1/completions", "E-q"),
                             ("http://q:1/v1/completions", "xfer")}
    assert health.status_code == 200
    assert health.json()["prefill"] == {"http://p:1": "down", "http://q:1": "up"}


def test_a_request_past_the_timeout_is_a_504_and_both_halves_are_closed():
    log: list = []
    router = _router(200, asyncio.Event(), log, timeout_s=0.2)   # decode never answers
    reply, _ = _ask(router)
    assert reply.status_code == 504
    assert reply.json()["error"]["message"].startswith(
        "no complete answer within the router's --request-timeout-s 0.2")
    assert "decode cancelled" in log


def test_no_decode_instance_up_is_a_503():
    log: list = []
    router = _router(200, asyncio.Event(), log)
    router.decoders[0].up = False
    reply, health = _ask(router)
    assert reply.status_code == 503 and "no decode instance answers /health" in \
        reply.json()["error"]["message"]
    assert health.status_code == 503 and log == []


@pytest.mark.parametrize("argv, message", [
    (["m", "--prefill", "2", "--prefill-tp", "1", "2", "4"],
     "--prefill-tp takes one TP size or 2 \\(one per instance\\), got 3"),
    (["m", "--decode", "0"], "--decode and --decode-tp must be >= 1"),
])
def test_launcher_refuses_bad_layouts(argv, message, capsys):
    from vllm_npu.disagg.launch import main

    with pytest.raises(SystemExit):
        main(argv)
    assert re.search(message, capsys.readouterr().err)


def test_launch_ports_stay_out_of_the_kernels_ephemeral_range(monkeypatch):
    """Instances bind their ports tens of seconds after launch; ports below the ephemeral
    range cannot be taken meanwhile by a connection's client side (a 2P1D cluster once
    failed with "Address already in use" on its bootstrap port). Never one port twice; a
    port someone holds is skipped; an exhausted range is an error that says so."""
    from vllm_npu.disagg import launch

    low, _ = launch._ephemeral_range()
    ports = [launch.free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(10000 <= p < low for p in ports)
    # a two-port window whose first port is held by someone else
    first = next(p for p in ports if p + 1 < low and p + 1 not in ports
                 and _bindable(p) and _bindable(p + 1))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        monkeypatch.setattr(launch, "_LOWEST", first)
        monkeypatch.setattr(launch, "_ephemeral_range", lambda: (first + 2, 60999))
        monkeypatch.setattr(launch, "_handed_out", set())
        assert launch.free_port() == first + 1
        with pytest.raises(RuntimeError, match=f"no free port on 127.0.0.1 in \\[{first}, "):
            launch.free_port()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_launcher_environment_per_instance(monkeypatch, tmp_path):
    """Every instance runs vLLM's real serving layout (engine processes, even when the
    caller runs engines in-process), on the cluster's host, with the caller's extra
    variables; a prefill instance also gets its Mooncake bootstrap port."""
    from vllm_npu.disagg.launch import PDCluster

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    c = PDCluster("m", host="127.0.0.2", log_dir=tmp_path,
                  env={"VLLM_WORKER_MULTIPROC_METHOD": "fork", "VLLM_HOST_IP": "override"})
    decode, prefill = c._env(None), c._env(12345)
    for e in (decode, prefill):
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in e
        assert e["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert decode["VLLM_HOST_IP"] == "override"  # the caller's variables win
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in decode
    assert prefill["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "12345"
    assert PDCluster("m", log_dir=tmp_path)._env(None)["VLLM_HOST_IP"] == "127.0.0.1"


@pytest.mark.parametrize("results, calls, expect", [
    ([0], 1, 0), ([-1, 0], 2, 0), ([-1, -1, 0], 3, 0), ([-1, -1, -1, 0], 3, -1)])
def test_a_failed_kv_write_is_retried_twice(results, calls, expect, monkeypatch):
    """The producer's write of a request's blocks (vLLM's `_send_blocks`): two retries after
    the transfer engine reports a failure, each after the transport's reconnect cooldown,
    then the failure goes to the decode side."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector
    from vllm_npu.distributed.kv_transfer import mooncake

    pauses: list[float] = []
    monkeypatch.setattr(mooncake.time, "sleep", pauses.append)

    # the override only works while vLLM's producer still calls this method by this name
    assert "_send_blocks" in vars(mooncake_connector.MooncakeConnectorWorker)
    seen, left = [], list(results)

    def write(session, src, dst, lengths):
        seen.append((session, list(src), list(dst), list(lengths)))
        return left.pop(0)

    class Bare(NPUMooncakeConnectorWorker):  # no engine, sockets or threads to close
        def __del__(self):
            pass

    worker = object.__new__(Bare)
    worker.engine = SimpleNamespace(batch_transfer_sync_write=write)
    worker.xfer_stats = SimpleNamespace(record_transfer=lambda **kw: None,
                                        record_failed_transfer=lambda: None)
    assert worker._send_blocks("127.0.0.1:1", [1, 2], [3, 4], [16, 16]) == expect
    assert seen == [("127.0.0.1:1", [1, 2], [3, 4], [16, 16])] * calls
    assert pauses == [mooncake.RETRY_PAUSE_S] * (calls - 1) and mooncake.RETRY_PAUSE_S > 1


def test_instances_die_with_a_launcher_killed_without_cleanup(tmp_path):
    """A launcher SIGKILLed (a test's timeout, the OOM killer) runs no cleanup: its
    instances, each in a session of its own, must not live on (left behind, they held the
    ports and the CPU of every later run)."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from vllm_npu.disagg.launch import PDCluster\n"
        f"c = PDCluster('m', log_dir=Path({str(tmp_path)!r}))\n"
        "inst = c._spawn('decode', 'decode0', ['sleep', '300'], 1)\n"
        "print(inst.proc.pid, flush=True)\n"
        "time.sleep(300)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True, cwd=Path(__file__).resolve().parents[2])
    child = int(launcher.stdout.readline())
    assert os.path.exists(f"/proc/{child}")
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        assert time.time() < deadline, "the instance outlived its launcher"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_metric_sum_filters_by_labels():
    """The instance-state reader sums a metric's samples, only those with the labels asked
    for, and not the samples of a metric whose name extends the one asked for."""
    from vllm_npu.disagg.instance_state import metric_sum

    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0',
        'vllm:num_requests_running_total{engine="0"} 100.0',
        "vllm:kv_cache_usage_perc 0.25"])
    assert metric_sum(text, "vllm:num_requests_running") == 5.0
    assert metric_sum(text, "vllm:num_requests_running", engine="1") == 3.0
    assert metric_sum(text, "vllm:kv_cache_usage_perc") == 0.25
    assert metric_sum(text, "vllm:num_requests_waiting") == 0.0
