"""The prefill/decode router for vLLM's MooncakeConnector: one OpenAI endpoint over xPyD.

vLLM 0.33 keeps its Mooncake router in the source tree's examples, not in the wheel, so the
plugin ships one. Per request (the connector's protocol, kv_connector/v1/mooncake):

1. pick a prefill instance and data-parallel rank and a decode instance (round robin over
   those that answer /health);
2. send the prefill instance the request with `max_tokens=1` and
   `kv_transfer_params = {do_remote_decode, transfer_id}`: it computes the prompt's KV and
   keeps the blocks until the decode side has pulled them;
3. at the same time send the decode instance the request with
   `kv_transfer_params = {do_remote_prefill, remote_engine_id, remote_bootstrap_addr,
   transfer_id}`: it pulls the KV through Mooncake (asking the prefill instance's bootstrap
   server where its workers are) and streams the answer back through this router.

A request for several samples of one prompt (n or best_of above 1) runs whole on a decode
instance: vLLM 0.33's connector moves one request's KV once, and each sample would pull it.

Both halves carry the client's X-Request-Id (one is made if it sent none). The client is
answered once the decode instance's first byte arrives, so a failure before it is a plain
status: 502 naming the prefill or decode instance and its error, 504 past
`--request-timeout-s`, 503 with no live instance. An instance that refused the connection
is marked down and the request tried once more on the others. After the first
byte a failure or the timeout ends the stream with an error event, as vLLM's server does.
Whatever ends a request - done, failed, timed out, the client gone - both halves are closed,
and vLLM aborts what is still running on either side.

    python -m vllm_npu.disagg.proxy --port 8000 \\
        --prefill http://127.0.0.1:8100 8998 --prefill http://127.0.0.1:8101 8999 \\
        --decode http://127.0.0.1:8200

Endpoints: POST /v1/completions, /v1/chat/completions; GET /v1/models, /version and POST
/tokenize, /detokenize (a decode instance answers); GET /health (200 while at least one
prefill and one decode instance answer theirs), /metrics (the router's own, Prometheus).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_npu.disagg.halves import decode_body, fans_out, finish_reason, prefill_body
from vllm_npu.disagg.outcomes import (
    ClientGone,
    DecodeFailed,
    Failed,
    PrefillFailed,
    Refused,
    TimedOut,
    Unavailable,
    error_body,
)
from vllm_npu.disagg.router_metrics import RouterMetrics

logger = logging.getLogger("vllm_npu.disagg.proxy")
DEFAULT_BOOTSTRAP_PORT = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default
HEALTH_TIMEOUT_S = 10.0
HEALTH_MISSES = 3
KEEPALIVE_S = 2.0     # < the instances' keep-alive (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s)


@dataclass
class Decoder:
    url: str
    up: bool = True
    misses: int = 0                     # /health polls in a row without an answer


@dataclass
class Prefiller(Decoder):
    bootstrap: str = ""                 # http://host:port of its Mooncake bootstrap server
    engine_ids: dict[int, str] = field(default_factory=dict)  # dp rank -> engine id


def parse_prefill(values: list[str]) -> Prefiller:
    if not 1 <= len(values) <= 2:
        raise argparse.ArgumentTypeError(f"--prefill URL [BOOTSTRAP_PORT], got {values}")
    url = values[0].rstrip("/")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise argparse.ArgumentTypeError(f"--prefill URL {url!r}: expected http://host:port")
    port = values[1] if len(values) == 2 else str(DEFAULT_BOOTSTRAP_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--prefill {url} bootstrap port {port!r}: "
                                         "expected a port number")
    return Prefiller(url, bootstrap=f"http://{parts.hostname}:{port}")


class Router:
    def __init__(self, prefillers: list[Prefiller], decoders: list[str], wait_s: float,
                 timeout_s: float | None = None, health_interval_s: float = 2.0):
        if not prefillers or not decoders:
            raise ValueError("the router needs at least one --prefill and one --decode")
        self.prefillers = prefillers
        self.decoders = [Decoder(d.rstrip("/")) for d in decoders]
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.health_interval_s = health_interval_s
        self.metrics = RouterMetrics()
        # An idle pooled connection is dropped before the instance's server closes it
        # (vLLM's uvicorn after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): with both at 5 s a request
        # sent on a connection the server was closing failed with ReadError (seen in a soak).
        self.client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=None,
            keepalive_expiry=KEEPALIVE_S))
        self.ready = False
        self._turn = {"prefill": 0, "decode": 0}

    # -- instances -------------------------------------------------------------------------
    async def _engine_ids(self, p: Prefiller) -> dict[int, str]:
        (await self.client.get(f"{p.url}/health", timeout=10)).raise_for_status()
        reply = await self.client.get(f"{p.bootstrap}/query", timeout=10)
        reply.raise_for_status()
        return {int(dp): e["engine_id"] for dp, e in reply.json().items()}

    async def discover(self) -> None:
        """Wait for every prefill instance, then read its engine ids from its bootstrap."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        for p in self.prefillers:
            while True:
                try:
                    p.engine_ids = await self._engine_ids(p)
                    if p.engine_ids:
                        break
                except httpx.HTTPError as e:
                    if loop.time() > deadline:
                        raise RuntimeError(f"prefill instance {p.url} (bootstrap "
                                           f"{p.bootstrap}) not ready after "
                                           f"{self.wait_s:g} s: {e}") from e
                await asyncio.sleep(0.5)
            logger.info("prefill %s: data-parallel ranks %s", p.url, sorted(p.engine_ids))
        for role, inst in self._instances():
            self.metrics.up.labels(role, inst.url).set(1)
        self.ready = True

    def _instances(self):
        return [("prefill", p) for p in self.prefillers] + \
               [("decode", d) for d in self.decoders]

    def _mark(self, role: str, inst, up: bool) -> None:
        if inst.up != up:
            logger.warning("%s instance %s is %s", role, inst.url, "back" if up else "down")
        inst.up = up
        self.metrics.up.labels(role, inst.url).set(int(up))

    async def _check(self, role: str, inst: Decoder) -> None:
        """A refused connection marks the instance down at once; a slow or failing answer
        only after HEALTH_MISSES polls in a row (a busy instance answers late)."""
        try:
            (await self.client.get(f"{inst.url}/health",
                                   timeout=HEALTH_TIMEOUT_S)).raise_for_status()
            if role == "prefill" and not inst.up:
                inst.engine_ids = await self._engine_ids(inst)  # a restart has new ids
            inst.misses = 0
            self._mark(role, inst, True)
        except httpx.HTTPError as e:
            inst.misses += 1
            if isinstance(e, httpx.ConnectError) or inst.misses >= HEALTH_MISSES:
                self._mark(role, inst, False)

    async def watch_health(self) -> None:
        while True:
            await asyncio.gather(*(self._check(r, i) for r, i in self._instances()))
            await asyncio.sleep(self.health_interval_s)

    def _next(self, role: str, live: list, pool: list) -> object:
        """Round robin over the live choices of one role."""
        if not live:
            raise Unavailable(f"no {role} instance answers /health "
                              f"({', '.join(x.url for x in pool)})")
        self._turn[role] += 1
        return live[(self._turn[role] - 1) % len(live)]

    def _pick_decode(self) -> Decoder:
        return self._next("decode", [d for d in self.decoders if d.up], self.decoders)

    def _pick_prefill(self) -> tuple[Prefiller, int]:
        live = [(p, dp) for p in self.prefillers if p.up for dp in sorted(p.engine_ids)]
        return self._next("prefill", live, self.prefillers)

    # -- one request -----------------------------------------------------------------------
    async def prefill(self, p: Prefiller, dp: int, api: str, body: dict, xfer: str,
                      request_id: str) -> None:
        body = prefill_body(body, xfer)
        t0 = time.monotonic()
        try:
            reply = await self.client.post(f"{p.url}{api}", json=body, headers={
                "X-Request-Id": request_id, "X-data-parallel-rank": str(dp)})
        except httpx.ConnectError as e:
            self._mark("prefill", p, False)
            raise PrefillFailed(f"prefill instance {p.url} unreachable: {e!r}",
                                refused=True) from e
        except httpx.HTTPError as e:
            raise PrefillFailed(f"prefill instance {p.url} failed: {e!r}") from e
        self.metrics.prefill.labels(p.url).observe(time.monotonic() - t0)
        if 400 <= reply.status_code < 500:    # the request's fault: the client gets it
            raise Refused(reply)
        if reply.status_code != 200:
            raise PrefillFailed(f"prefill instance {p.url} answered {reply.status_code}: "
                                f"{reply.text[:500]}")
        finish = finish_reason(reply)
        if finish != "length":     # no KV will come: fail now, not after the decode's wait
            raise PrefillFailed(f"prefill instance {p.url} ended the request with "
                                f"finish_reason {finish!r}, not 'length': it sends no KV")

    async def handle(self, api: str, request: Request) -> Response:
        t0 = time.monotonic()
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        self.metrics.in_flight.inc()
        exchange = None
        try:
            try:
                body = json.loads(await request.body())
                if not isinstance(body, dict):
                    raise ValueError(f"expected a JSON object, got {type(body).__name__}")
            except ValueError as e:
                self._finish(api, "bad_request", t0)
                return JSONResponse(error_body(f"the request body is not JSON: {e}",
                                                "BadRequestError", 400), status_code=400)
            if not self.ready:
                raise Unavailable("the router is still discovering its prefill instances")
            deadline = None if self.timeout_s is None else t0 + self.timeout_s
            for attempt in (1, 2):
                exchange = _Exchange(self, api, body, request_id, request, deadline)
                try:
                    first = await exchange.start()
                    break
                except (PrefillFailed, DecodeFailed) as e:
                    await exchange.close()
                    if attempt == 2 or not e.refused:
                        raise
                    logger.warning("%s; request %s tried again", e, request_id)
            self.metrics.first_byte.labels(api).observe(time.monotonic() - t0)
            reply = exchange.reply
            headers = {"X-Request-Id": request_id}
            if reply.status_code != 200 or not body.get("stream"):
                content = first + await exchange.read_rest()
                await exchange.close()
                self._finish(api, "ok" if reply.status_code == 200 else "upstream_error", t0)
                return Response(content, status_code=reply.status_code, headers=headers,
                                media_type=reply.headers.get("content-type"))
            stream = _Stream(self._relay(exchange, first, t0), headers=headers,
                             media_type=reply.headers.get("content-type"))
            exchange = None  # the stream owns it now
            return stream
        except Failed as e:
            logger.error("request %s: %s", request_id, e)
            self._finish(api, e.outcome, t0)
            return e.response(request_id)
        except ClientGone:
            self._finish(api, "client_disconnected", t0)
            return Response(status_code=499)
        except Exception as e:  # a router bug: answer, count it, keep serving
            logger.exception("request %s", request_id)
            self._finish(api, "upstream_error", t0)
            return JSONResponse(error_body(f"router error: {e!r}", "InternalServerError",
                                            500), status_code=500)
        finally:
            if exchange is not None:
                await exchange.close()

    def _finish(self, api: str, outcome: str, t0: float) -> None:
        self.metrics.in_flight.dec()
        self.metrics.requests.labels(api, outcome).inc()
        self.metrics.latency.labels(api).observe(time.monotonic() - t0)

    async def _relay(self, exchange: _Exchange, first: bytes,
                     t0: float) -> AsyncIterator[bytes]:
        outcome = "client_disconnected"  # what a cancellation (Starlette's) leaves
        try:
            yield first
            tail = first
            while True:
                try:
                    chunk = await exchange.next_chunk()
                except ClientGone:
                    return
                except Failed as e:
                    logger.error("request %s: %s; the stream ends with an error event",
                                 exchange.request_id, e)
                    outcome = e.outcome
                    end = b"" if tail.endswith(b"\n\n") else b"\n\n"
                    yield end + b"data: " + json.dumps(error_body(
                        str(e), e.kind, e.status)).encode() + b"\n\ndata: [DONE]\n\n"
                    return
                if chunk is None:
                    outcome = "ok"
                    return
                tail = chunk
                yield chunk
        finally:
            # Starlette cancels the stream's task group when the client goes: every await in
            # it raises again unless shielded, and the decode connection would stay open.
            with anyio.CancelScope(shield=True):
                await exchange.close()
            self._finish(exchange.api, outcome, t0)


class _Exchange:
    """A client's request through the router: its prefill task and its decode reply. Every
    wait races the prefill half failing, the deadline and the client going away."""

    def __init__(self, router: Router, api: str, body: dict, request_id: str,
                 request: Request, deadline: float | None):
        self.router, self.api, self.body = router, api, body
        self.request_id, self.request, self.deadline = request_id, request, deadline
        self.prefill_task: asyncio.Task | None = None
        self.gone: asyncio.Task | None = None
        self.reply: httpx.Response | None = None
        self.chunks = None
        self.complete = False           # the decode reply read to its end
        self.decoder: Decoder | None = None

    async def start(self) -> bytes:
        """Send both halves; return the decode instance's first byte(s)."""
        self.decoder = self.router._pick_decode()
        self.gone = asyncio.create_task(_disconnected(self.request))
        if fans_out(self.body):     # runs whole on the decode instance (halves.py)
            self.prefill_task = asyncio.create_task(asyncio.sleep(0))
            body = dict(self.body)
        else:
            p, dp = self.router._pick_prefill()
            xfer = f"xfer-{self.request_id}-{uuid.uuid4().hex[:8]}"
            self.prefill_task = asyncio.create_task(self.router.prefill(
                p, dp, self.api, self.body, xfer, self.request_id))
            body = decode_body(self.body, p.engine_ids[dp], p.bootstrap, xfer)
        url = self.decoder.url
        # Its own connection (closed after it, never pooled): close() may shut the socket
        # of a reply the client left, and httpx may have put that connection back in the
        # pool already (its body was all read): the next request sent on it failed with
        # ReadError (58 of 579 requests in 45 s of streams ending on [DONE]).
        send = self.router.client.send(self.router.client.build_request(
            "POST", f"{url}{self.api}", json=body,
            headers={"X-Request-Id": self.request_id, "Connection": "close"}), stream=True)
        self.reply = await self._wait(send, f"the decode instance {url}'s answer")
        self.chunks = self.reply.aiter_bytes()
        first = await self.next_chunk()
        return first or b""

    async def next_chunk(self) -> bytes | None:
        try:
            return await self._wait(self.chunks.__anext__(),
                                    f"the decode instance {self.decoder.url}'s answer")
        except StopAsyncIteration:
            self.complete = True
            return None

    async def read_rest(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    async def _wait(self, work: Awaitable, what: str):
        work = asyncio.ensure_future(work)
        try:
            while True:
                waiting = {work}
                if not self.prefill_task.done():
                    waiting.add(self.prefill_task)
                if self.gone is not None:
                    waiting.add(self.gone)
                left = None if self.deadline is None else self.deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimedOut(f"no complete answer within the router's "
                                   f"--request-timeout-s {self.router.timeout_s:g} "
                                   f"(waiting for {what})")
                await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                task = self.prefill_task
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
                if self.gone is not None and self.gone.done():
                    raise ClientGone()
                if work.done():
                    try:
                        return work.result()
                    except httpx.HTTPError as e:
                        refused = isinstance(e, httpx.ConnectError)
                        if refused:
                            self.router._mark("decode", self.decoder, False)
                        raise DecodeFailed(f"decode instance {self.decoder.url} failed: "
                                           f"{e!r}", refused) from e
        finally:
            if not work.done():
                work.cancel()
            with suppress(BaseException):
                await work      # also retrieves its exception when another failure won

    async def close(self) -> None:
        """Close both halves: vLLM aborts whatever is still running on either side."""
        for task in (self.gone, self.prefill_task):
            if task is not None and not task.done():
                task.cancel()
            if task is not None:
                with suppress(BaseException):
                    await task      # also retrieves a failed prefill's exception
        if self.reply is not None:
            await self.reply.aclose()
            if not self.complete:
                # httpx leaves the connection of a half-read reply open now and then (seen:
                # sockets ESTABLISHED with the decode's unread stream in their queue, and
                # the request generating on to its end); its socket closed, vLLM aborts.
                stream = self.reply.extensions.get("network_stream")
                if stream is not None:
                    await stream.aclose()


class _Stream(StreamingResponse):
    """Closes its relay however the response ends. When the client goes, Starlette cancels
    the response while the relay may sit at a `yield`, not in an await: the generator is then
    left unfinished (closed only when garbage-collected, the decode request running on)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _endpoint(handler, path: str):
    async def endpoint(request: Request) -> Response:
        return await handler(path, request)
    return endpoint


def build_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.discover()
        watch = asyncio.create_task(router.watch_health())
        yield
        watch.cancel()
        await router.client.aclose()

    app = FastAPI(lifespan=lifespan)

    async def forward(method: str, path: str, request: Request) -> Response:
        """A request any instance answers alike (the model list, tokenizing): to a decode
        instance, the next one if it is unreachable."""
        content = await request.body()
        for _ in router.decoders:
            try:
                decoder = router._pick_decode()
            except Unavailable as e:
                return e.response(path)
            try:
                reply = await router.client.request(
                    method, f"{decoder.url}{path}", content=content, timeout=60,
                    headers={"content-type": request.headers.get("content-type",
                                                                 "application/json")})
                return Response(reply.content, status_code=reply.status_code,
                                media_type=reply.headers.get("content-type"))
            except httpx.HTTPError:
                router._mark("decode", decoder, False)
        return Unavailable(f"no decode instance answered {path}").response(path)

    for method, path, handler in (
            ("POST", "/v1/completions", router.handle),
            ("POST", "/v1/chat/completions", router.handle),
            *((m, p, functools.partial(forward, m)) for m, p in (
                ("GET", "/v1/models"), ("GET", "/version"), ("POST", "/tokenize"),
                ("POST", "/detokenize")))):
        app.add_api_route(path, _endpoint(handler, path), methods=[method])

    @app.get("/health")
    async def health():
        state = {role: {i.url: "up" if i.up else "down" for i in pool} for role, pool in
                 (("prefill", router.prefillers), ("decode", router.decoders))}
        ok = router.ready and all("up" in s.values() for s in state.values())
        return JSONResponse(state, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(router.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", nargs="+", action="append", required=True,
                    metavar=("URL", "BOOTSTRAP_PORT"),
                    help="a prefill instance and its VLLM_MOONCAKE_BOOTSTRAP_PORT "
                         f"(default {DEFAULT_BOOTSTRAP_PORT}); repeat for xPyD")
    ap.add_argument("--decode", action="append", required=True, metavar="URL",
                    help="a decode instance; repeat for several")
    ap.add_argument("--wait-s", type=float, default=600.0,
                    help="how long to wait for the prefill instances at startup")
    ap.add_argument("--request-timeout-s", type=float, default=None,
                    help="end a request not complete after this many seconds (504, or an "
                         "error event in a stream) and abort it on both instances; "
                         "default: no limit")
    ap.add_argument("--health-interval-s", type=float, default=2.0,
                    help="how often every instance's /health is polled")
    args = ap.parse_args(argv)
    try:
        prefillers = [parse_prefill(v) for v in args.prefill]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    for name in ("request_timeout_s", "health_interval_s"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {value:g}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per health poll else

    import uvicorn

    router = Router(prefillers, args.decode, args.wait_s, args.request_timeout_s,
                    args.health_interval_s)
    uvicorn.run(build_app(router), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
