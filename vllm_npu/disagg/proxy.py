"""The prefill/decode router for vLLM's MooncakeConnector: one OpenAI endpoint over xPyD.

vLLM 0.33 keeps its Mooncake router in the source tree's examples, not in the wheel, so the
plugin ships one. Per request (the connector's protocol, kv_connector/v1/mooncake):

1. pick a prefill instance and data-parallel rank (round robin) and a decode instance;
2. send the prefill instance the request with `max_tokens=1` and
   `kv_transfer_params = {do_remote_decode, transfer_id}`: it computes the prompt's KV and
   keeps the blocks until the decode side has pulled them;
3. at the same time send the decode instance the request with
   `kv_transfer_params = {do_remote_prefill, remote_engine_id, remote_bootstrap_addr,
   transfer_id}`: it pulls the KV through Mooncake (asking the prefill instance's bootstrap
   server where its workers are) and streams the answer back through this router.

If the prefill side fails the request (a 4xx/5xx, or the instance is unreachable), the decode
request is cancelled - vLLM aborts it and frees its blocks - and the client gets a 502 naming
the prefill instance and its error. A decode error is passed through with its status.

    python -m vllm_npu.disagg.proxy --port 8000 \\
        --prefill http://127.0.0.1:8100 8998 --prefill http://127.0.0.1:8101 8999 \\
        --decode http://127.0.0.1:8200
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

logger = logging.getLogger("vllm_npu.disagg.proxy")
DEFAULT_BOOTSTRAP_PORT = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default


class PrefillFailed(Exception):
    pass


@dataclass
class Prefiller:
    url: str
    bootstrap: str                      # http://host:port of its Mooncake bootstrap server
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
    return Prefiller(url, f"http://{parts.hostname}:{port}")


class Router:
    def __init__(self, prefillers: list[Prefiller], decoders: list[str], wait_s: float):
        if not prefillers or not decoders:
            raise ValueError("the router needs at least one --prefill and one --decode")
        self.prefillers = prefillers
        self.decoders = [d.rstrip("/") for d in decoders]
        self.wait_s = wait_s
        self.client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=None))
        self._targets: itertools.cycle | None = None
        self._decode = itertools.cycle(self.decoders)

    async def discover(self) -> None:
        """Wait for every prefill instance, then read its engine ids from its bootstrap."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        for p in self.prefillers:
            while True:
                try:
                    (await self.client.get(f"{p.url}/health")).raise_for_status()
                    reply = await self.client.get(f"{p.bootstrap}/query")
                    reply.raise_for_status()
                    p.engine_ids = {int(dp): e["engine_id"] for dp, e in reply.json().items()}
                    if p.engine_ids:
                        break
                except httpx.HTTPError as e:
                    if loop.time() > deadline:
                        raise RuntimeError(f"prefill instance {p.url} (bootstrap "
                                           f"{p.bootstrap}) not ready after "
                                           f"{self.wait_s:g} s: {e}") from e
                await asyncio.sleep(0.5)
            logger.info("prefill %s: data-parallel ranks %s", p.url, sorted(p.engine_ids))
        self._targets = itertools.cycle(
            [(p, dp) for p in self.prefillers for dp in sorted(p.engine_ids)])

    async def prefill(self, p: Prefiller, dp: int, api: str, body: dict, xfer: str,
                      request_id: str) -> None:
        body = dict(body, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer})
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = 1
        body.pop("stream_options", None)
        try:
            reply = await self.client.post(f"{p.url}{api}", json=body, headers={
                "X-Request-Id": request_id, "X-data-parallel-rank": str(dp)})
        except httpx.HTTPError as e:
            raise PrefillFailed(f"prefill instance {p.url} unreachable: {e!r}") from e
        if reply.status_code != 200:
            raise PrefillFailed(f"prefill instance {p.url} answered {reply.status_code}: "
                                f"{reply.text[:500]}")

    async def handle(self, api: str, request: Request) -> Response:
        if self._targets is None:
            return JSONResponse({"error": "the router is still discovering its prefill "
                                          "instances"}, status_code=503)
        body = await request.json()
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        xfer = f"xfer-{request_id}"
        p, dp = next(self._targets)
        decoder = next(self._decode)
        prefill = asyncio.create_task(self.prefill(p, dp, api, body, xfer, request_id))
        prefill.add_done_callback(_log_failure)
        decode_body = dict(body, kv_transfer_params={
            "do_remote_decode": False, "do_remote_prefill": True,
            "remote_engine_id": p.engine_ids[dp], "remote_bootstrap_addr": p.bootstrap,
            "transfer_id": xfer})
        decode_request = self.client.build_request(
            "POST", f"{decoder}{api}", json=decode_body, headers={"X-Request-Id": request_id})
        try:
            reply = await _unless_failed(self.client.send(decode_request, stream=True), prefill)
        except PrefillFailed as e:
            return JSONResponse({"error": str(e)}, status_code=502)
        except httpx.HTTPError as e:
            prefill.cancel()
            return JSONResponse({"error": f"decode instance {decoder} unreachable: {e!r}"},
                                status_code=502)
        if reply.status_code != 200:
            content = await reply.aread()
            await reply.aclose()
            return Response(content, status_code=reply.status_code,
                            media_type=reply.headers.get("content-type"))
        return StreamingResponse(_relay(reply, prefill),
                                 media_type=reply.headers.get("content-type"))


async def _unless_failed(work: Awaitable, prefill: asyncio.Task):
    """`await work`, unless the prefill request fails first (then cancel work, raise)."""
    work = asyncio.ensure_future(work)
    while True:
        waiting = {work} if prefill.done() else {work, prefill}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if prefill.done() and not prefill.cancelled() and prefill.exception() is not None \
                and not work.done():
            work.cancel()
            raise prefill.exception()
        if work.done():
            return work.result()


def _log_failure(prefill: asyncio.Task) -> None:
    if not prefill.cancelled() and prefill.exception() is not None:
        logger.error("%s", prefill.exception())


async def _relay(reply: httpx.Response, prefill: asyncio.Task) -> AsyncIterator[bytes]:
    chunks = reply.aiter_bytes()
    try:
        while True:
            try:
                yield await _unless_failed(chunks.__anext__(), prefill)
            except StopAsyncIteration:
                return
            except PrefillFailed as e:
                logger.error("%s; the decode stream is cancelled", e)
                return
    finally:
        await reply.aclose()


def build_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.discover()
        yield
        await router.client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await router.handle("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await router.handle("/v1/chat/completions", request)

    @app.get("/health")
    async def health():
        return {"prefill": [p.url for p in router.prefillers], "decode": router.decoders}

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
    args = ap.parse_args(argv)
    try:
        prefillers = [parse_prefill(v) for v in args.prefill]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import uvicorn

    uvicorn.run(build_app(Router(prefillers, args.decode, args.wait_s)),
                host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
