"""A fault-injecting HTTP proxy between the harness and a real engine (tests only).

It listens on 127.0.0.1 on an ephemeral port and forwards chat requests to the engine,
spoiling each one as its fault schedule says: the n-th request gets ``faults[n]`` (then
``"pass"`` once the schedule is used up). Everything else (``/health``, ``/metrics``) is
forwarded untouched. It runs its own event loop in a thread, so a test (or a ``specsoak run``
in a subprocess, through ``server.request_base_url``) can drive it from outside.

Faults (what the proxy does -> what the harness must record):

| fault | the proxy | expected ``error_kind`` |
|---|---|---|
| ``pass`` | forwards the stream verbatim | (ok) |
| ``truncate`` | forwards 3 text chunks, then ends the response cleanly: no finish, no ``[DONE]`` | truncated |
| ``stall`` | forwards 3 text chunks, then sends nothing until the client gives up | stall (timeout when the request timeout is shorter) |
| ``reset_before`` | resets the TCP connection (RST) before any header | connection |
| ``reset_mid`` | forwards 3 text chunks, then resets the connection | truncated |
| ``http_500`` / ``http_502`` | answers 500 / 502 without asking the engine | server_error |
| ``http_429`` / ``http_503`` | answers 429 / 503 without asking the engine | overload |
| ``slow_headers`` | holds the headers back for ``slow_s`` (more than the stall timeout) | stall / timeout |
| ``slow_headers_ok`` | holds the headers back 1 s, then forwards: a slow success, never a fast one | (ok, TTFT >= 1 s) |
| ``malformed`` | forwards 3 text chunks, then a ``data:`` line that is not JSON | malformed |
| ``duplicate`` | forwards the stream with its second text chunk sent twice | duplicate |

Apart from the schedule, ``corrupt_answers`` (set it at any time) spoils every whole (not streamed) answer from then
on: llama.cpp's ``/completion`` and a non-streamed chat answer keep their first ``CORRUPT_FROM`` tokens and text
characters and get different ones after, as an engine that started giving wrong answers would (the soak's output
canary must call it a divergence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

FAULTS = (
    "pass",
    "truncate",
    "stall",
    "reset_before",
    "reset_mid",
    "http_500",
    "http_502",
    "http_429",
    "http_503",
    "slow_headers",
    "slow_headers_ok",
    "malformed",
    "duplicate",
)
KEEP_CHUNKS = 3  # text chunks forwarded before a mid-stream fault
CORRUPT_FROM = 5  # corrupt_answers: tokens (and characters) kept before the answer goes wrong


def corrupt_answer(data: Any) -> Any:
    """A whole answer with its tokens and text changed from position CORRUPT_FROM on (llama.cpp /completion:
    ``content`` and ``tokens``; OpenAI chat: each choice's message content and ``token_ids``)."""
    if not isinstance(data, dict):
        return data

    def ids(v: Any) -> Any:
        return [t if i < CORRUPT_FROM else t + 1 for i, t in enumerate(v)] if isinstance(v, list) else v

    def text(v: Any) -> Any:
        return v[:CORRUPT_FROM] + " corrupted answer" if isinstance(v, str) else v

    out = dict(data)
    if "content" in out:
        out["content"], out["tokens"] = text(out["content"]), ids(out.get("tokens"))
    choices = []
    for c in out.get("choices") or ():
        c = dict(c)
        if isinstance(c.get("message"), dict):
            c["message"] = {**c["message"], "content": text(c["message"].get("content"))}
        c["token_ids"] = ids(c.get("token_ids"))
        choices.append(c)
    if choices:
        out["choices"] = choices
    return out


def _is_text_chunk(line: bytes) -> bool:
    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
        return False
    try:
        chunk = json.loads(line[5:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ())


def _reset(request: web.Request) -> None:
    """Close the client's connection with a TCP RST (SO_LINGER 0), not a clean FIN."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FaultProxy:
    def __init__(self, upstream: str, faults: Sequence[str] = (), slow_s: float = 30.0):
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}")
        self.upstream = upstream.rstrip("/")
        self.schedule = list(faults)
        self.slow_s = slow_s
        self.seen: list[str] = []  # the fault applied to each chat request, in arrival order
        self.corrupt_answers = False  # from now on, whole answers come back with wrong tokens (corrupt_answer)
        self.corrupted = 0  # answers corrupted so far
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._closing: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _start(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = int(server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        assert self._closing is not None and self._runner is not None
        self._closing.set()
        await self._runner.cleanup()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _sleep(self, seconds: float) -> None:
        assert self._closing is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if self.corrupt_answers and request.method == "POST" and _whole_answer(request.path, body):
            return await self._forward_corrupted(request, body)
        if request.method != "POST" or not request.path.endswith("/chat/completions"):
            return await self._forward_plain(request, body)
        n = len(self.seen)
        fault = self.schedule[n] if n < len(self.schedule) else "pass"
        self.seen.append(fault)
        if fault == "reset_before":
            _reset(request)
            return web.Response(status=500)  # never sent: the connection is gone
        if fault.startswith("http_"):
            status = int(fault[5:])
            message = {429: "too many requests", 503: "Loading model", 502: "bad gateway", 500: "internal error"}[
                status
            ]
            return web.json_response({"error": {"code": status, "message": f"fault proxy: {message}"}}, status=status)
        if fault == "slow_headers":
            await self._sleep(self.slow_s)
        elif fault == "slow_headers_ok":
            await self._sleep(1.0)
        try:
            return await self._forward_stream(request, body, fault)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            return web.Response(status=500)  # the client went away (it gave up): nothing more to send

    def _upstream_headers(self, request: web.Request) -> dict[str, str]:
        keep = ("Content-Type", "Authorization", "Accept")
        return {k: v for k, v in request.headers.items() if k in keep}

    async def _forward_plain(self, request: web.Request, body: bytes) -> web.Response:
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=body or None,
                headers=self._upstream_headers(request),
            ) as up,
        ):
            data = await up.read()
            return web.Response(status=up.status, body=data, content_type=up.content_type)

    async def _forward_corrupted(self, request: web.Request, body: bytes) -> web.Response:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.upstream + request.path_qs, data=body, headers=self._upstream_headers(request)) as up,
        ):
            data = await up.read()
            if up.status != 200:
                return web.Response(status=up.status, body=data, content_type=up.content_type)
        self.corrupted += 1
        return web.json_response(corrupt_answer(json.loads(data)))

    async def _forward_stream(self, request: web.Request, body: bytes, fault: str) -> web.StreamResponse:
        timeout = aiohttp.ClientTimeout(total=300)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.upstream + request.path_qs, data=body, headers=self._upstream_headers(request)) as up,
        ):
            if up.status != 200:
                return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            sent_text = 0
            async for line in up.content:
                text = _is_text_chunk(line)
                if text and sent_text == KEEP_CHUNKS and fault in ("truncate", "stall", "reset_mid", "malformed"):
                    return await self._spoil(request, resp, fault)
                await resp.write(line)
                if text:
                    sent_text += 1
                    if fault == "duplicate" and sent_text == 2:
                        await resp.write(b"\n" + line)
            await resp.write_eof()
            return resp

    async def _spoil(self, request: web.Request, resp: web.StreamResponse, fault: str) -> web.StreamResponse:
        if fault == "truncate":
            await resp.write_eof()  # a clean end of the HTTP body, but the stream never finished
        elif fault == "stall":
            await self._sleep(self.slow_s)
        elif fault == "reset_mid":
            _reset(request)
        elif fault == "malformed":
            await resp.write(b'data: {"choices": [{"delta": {"content": "x"\n\n')
            await resp.write_eof()
        return resp


def _whole_answer(path: str, body: bytes) -> bool:
    """A request for a whole generated answer: llama.cpp's /completion, or a chat completion that is not streamed."""
    if path.endswith("/completion"):
        return True
    if not path.endswith("/chat/completions"):
        return False
    try:
        return not json.loads(body).get("stream")
    except (ValueError, AttributeError):
        return False


def expected_kind(fault: str, stall_is_timeout: bool = False) -> str | None:
    """The error_kind the harness must record for ``fault`` (None: a successful request)."""
    kinds: dict[str, Any] = {
        "pass": None,
        "slow_headers_ok": None,
        "truncate": "truncated",
        "stall": "timeout" if stall_is_timeout else "stall",
        "slow_headers": "timeout" if stall_is_timeout else "stall",
        "reset_before": "connection",
        "reset_mid": "truncated",
        "http_500": "server_error",
        "http_502": "server_error",
        "http_429": "overload",
        "http_503": "overload",
        "malformed": "malformed",
        "duplicate": "duplicate",
    }
    return kinds[fault]
