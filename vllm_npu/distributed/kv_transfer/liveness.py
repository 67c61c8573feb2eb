"""Fail a KV pull in seconds when its prefill worker dies, instead of when a socket times out.

vLLM's Mooncake consumer waits for a prefill worker's answer on a ZMQ DEALER socket whose
receive timeout is `VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60` s (540 s by default); a ZMQ
socket does not notice a dead peer, so a request whose prefill instance was killed holds its
decode blocks that long. While a pull waits, `watch_peer` probes the worker's side-channel
port (a TCP connect: a dead process on a live host refuses it at once, a dead host times
out); after `misses` failed probes in a row it interrupts the pull with `PeerLost`, which
vLLM's own error path turns into a failed KV load (the request fails or is recomputed per
`kv_load_failure_policy`, and its blocks are freed).
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from urllib.parse import urlsplit


class PeerLost(ConnectionError):
    pass


async def probe(addr: str, timeout: float) -> bool:
    """True if something accepts a TCP connection at `tcp://host:port`."""
    parts = urlsplit(addr)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


class _Interruptible:
    """Awaits `coro`; a cancel that comes with `interrupt(exc)` reaches `coro` as `exc`
    (an ordinary exception its own handlers see), any other cancel passes through."""

    def __init__(self, coro: Coroutine):
        self._coro = coro
        self._exc: BaseException | None = None

    def interrupt(self, exc: BaseException) -> None:
        self._exc = exc

    def __await__(self):
        send, throw = None, None
        while True:
            try:
                step = self._coro.send(send) if throw is None else self._coro.throw(throw)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                send = yield step
            except asyncio.CancelledError as cancel:
                throw, self._exc = (self._exc or cancel), None
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine
                throw = exc


async def watch_peer(coro: Coroutine, addr: str, interval_s: float, misses: int) -> None:
    """Run `coro` (a pull from the worker at `addr`); interrupt it if `addr` stops
    accepting connections for `misses` probes `interval_s` apart."""
    pull = _Interruptible(coro)

    async def run():
        return await pull

    task = asyncio.ensure_future(run())
    missed = 0
    while not task.done():
        await asyncio.wait({task}, timeout=interval_s)
        if task.done():
            break
        missed = 0 if await probe(addr, interval_s) else missed + 1
        if missed >= misses:
            pull.interrupt(PeerLost(
                f"prefill worker {addr} stopped accepting connections ({misses} probes "
                f"{interval_s:g} s apart failed): its instance is gone"))
            task.cancel()
            break
    await asyncio.wait({task})
    task.result()
