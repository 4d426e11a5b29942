"""A fake OpenAI-compatible streaming server with a known token schedule, for client benchmarks.

Every streamed answer follows one schedule: the first token ``ttft_ms`` after the request
arrived, then one token every ``itl_ms``, except that every ``stall_every``-th gap lasts
``stall_ms`` (single-token stalls: a client that averages ITL per request hides them, a
per-chunk p99 shows them). ``max_tokens`` (or ``max_completion_tokens``) tokens per answer,
``ignore_eos`` implied; ``usage`` rides in the final chunk when the client asks for it.

The server writes down what it really did, so the clients' figures can be checked against it:
per request, its arrival time, the key of its prompt (the first word of the last message) and
the ``time.perf_counter_ns()`` of each chunk handed to the socket (CLOCK_MONOTONIC is one clock
for every process on the machine, so these times compare directly with a client's), whether
the stream completed, and how late the server itself was against its schedule.

    python -m bench.fake_server --ttft-ms 50 --itl-ms 20 --log /tmp/x/server.jsonl --port-file /tmp/x/port

binds 127.0.0.1 on an ephemeral port, writes the port to ``--port-file`` when it is listening,
and writes the log on SIGTERM/SIGINT (one JSON line per request). Never imported by the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL = "fake-model"


@dataclass(frozen=True)
class Schedule:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    stall_every: int = 0  # 0: no stalls
    stall_ms: float = 0.0
    default_tokens: int = 128

    def gap_ns(self, i: int) -> int:
        """The gap before token i (i >= 1)."""
        if self.stall_every and i % self.stall_every == 0:
            return int(self.stall_ms * 1e6)
        return int(self.itl_ms * 1e6)


@dataclass
class Served:
    n: int
    key: str
    recv_ns: int
    recv_unix: float
    tokens: int
    sent_ns: list[int] = field(default_factory=list)
    late_ns: list[int] = field(default_factory=list)
    completed: bool = False
    end_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "key": self.key,
            "recv_ns": self.recv_ns,
            "recv_unix": self.recv_unix,
            "tokens": self.tokens,
            "sent_ns": self.sent_ns,
            "late_ns": self.late_ns,
            "completed": self.completed,
            "end_ns": self.end_ns,
        }


def _prompt_key(body: dict[str, Any]) -> str:
    msgs = body.get("messages")
    text = ""
    if isinstance(msgs, list) and msgs:
        content = msgs[-1].get("content", "") if isinstance(msgs[-1], dict) else ""
        if isinstance(content, list):  # content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = str(content)
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    return text.split(maxsplit=1)[0][:64] if text.strip() else ""


class FakeServer:
    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.served: list[Served] = []
        self._n = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "specsoak-bench"}]}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        recv_ns = time.perf_counter_ns()
        recv_unix = time.time()
        body = await request.json()
        n = self._n
        self._n += 1
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or self.schedule.default_tokens)
        rec = Served(n, _prompt_key(body), recv_ns, recv_unix, tokens)
        self.served.append(rec)
        cid = f"fake-{n}"
        created = int(recv_unix)
        obj = "chat.completion.chunk" if chat else "text_completion"
        if not body.get("stream"):
            await asyncio.sleep(self.schedule.ttft_ms / 1e3)
            rec.completed, rec.end_ns = True, time.perf_counter_ns()
            text = " tok" * tokens
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            )
            return web.json_response(
                {
                    "id": cid,
                    "object": obj.replace(".chunk", ""),
                    "created": created,
                    "model": MODEL,
                    "choices": [{**choice, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
                }
            )
        want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        head = f'data: {{"id":"{cid}","object":"{obj}","created":{created},"model":"{MODEL}","choices":[{{"index":0,'
        token_chunk = (
            head
            + (
                '"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
                if chat
                else '"text":" tok","finish_reason":null}]}\n\n'
            )
        ).encode()
        usage = (
            f',"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},"total_tokens":{8 + tokens}}}'
            if want_usage
            else ""
        )
        last = (
            head
            + (
                '"delta":{"content":" tok"},"finish_reason":"length"}]'
                if chat
                else '"text":" tok","finish_reason":"length"}]'
            )
            + usage
            + "}\n\n"
        ).encode()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        due = recv_ns + int(self.schedule.ttft_ms * 1e6)
        try:
            for i in range(tokens):
                if i:
                    due += self.schedule.gap_ns(i)
                wait = due - time.perf_counter_ns()
                if wait > 0:
                    await asyncio.sleep(wait / 1e9)
                now = time.perf_counter_ns()
                rec.sent_ns.append(now)
                rec.late_ns.append(now - due)
                await resp.write(last if i == tokens - 1 else token_chunk)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            rec.completed = True
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away: the record says how far it got
        finally:
            rec.end_ns = time.perf_counter_ns()
        return resp

    def write_log(self, path: Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for r in self.served:
                f.write(json.dumps(r.to_dict(), separators=(",", ":")) + "\n")


async def serve(schedule: Schedule, log: Path, port_file: Path | None) -> None:
    server = FakeServer(schedule)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # a started site has a server
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, port_file)
    print(f"fake server on http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.write_log(log)
    await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--stall-every", type=int, default=0)
    ap.add_argument("--stall-ms", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=128, help="tokens when a request names no max_tokens")
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--port-file", type=Path)
    a = ap.parse_args()
    sched = Schedule(a.ttft_ms, a.itl_ms, a.stall_every, a.stall_ms, a.tokens)
    asyncio.run(serve(sched, a.log, a.port_file))


if __name__ == "__main__":
    main()
