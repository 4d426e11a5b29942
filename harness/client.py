"""The streaming client: OpenAI-compatible chat completions, every chunk timestamped.

One fresh connection per request: llama-server advertises keep-alive on streamed answers
and then closes the connection, so pooled clients fail requests at random. Failed requests
are records with ``status="error"`` and an ``error_kind``, never exceptions.
Timing definitions: docs/metrics.md#per-request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from engines.base import Engine
from harness.prompts import Prompt
from harness.records import RequestRecord

ERROR_KINDS = (
    "overload",  # 429 / 503
    "context_overflow",  # prompt + output do not fit
    "server_error",  # other 5xx
    "http_error",  # other non-200
    "connection",  # refused, reset, disconnected
    "timeout",  # no complete answer within the request timeout
    "stall",  # no chunk for the stall timeout
    "malformed",  # a chunk that is not JSON
    "truncated",  # stream ended without a finish
    "empty",  # finished without a single token
)


@dataclass(frozen=True)
class RequestParams:
    max_tokens: int
    temperature: float = 0.0
    seed: int = 42
    ignore_eos: bool = True
    timeout_s: float = 300.0
    stall_s: float = 60.0
    keep_text: bool = True


def _classify_http(status: int, body: str) -> str:
    low = body.lower()
    if status in (429, 503):
        return "overload"
    if status == 400 and ("context" in low or "exceed" in low):
        return "context_overflow"
    if status >= 500:
        return "server_error"
    return "http_error"


async def stream_one(
    session: aiohttp.ClientSession,
    engine: type[Engine] | Engine,
    url: str,
    prompt: Prompt,
    params: RequestParams,
    extras: dict[str, Any],
    meta: dict[str, Any],
    wall_anchor: tuple[float, int],
) -> RequestRecord:
    """Send one streamed chat request and build its record. Never raises for request failures."""
    body = {
        "messages": prompt.messages,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "seed": params.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": params.ignore_eos,
        **extras,
    }
    anchor_unix, anchor_ns = wall_anchor
    t0 = time.perf_counter_ns()
    start_unix = anchor_unix + (t0 - anchor_ns) / 1e9
    chunk_times: list[int] = []
    parts: list[str] = []
    usage: dict[str, Any] = {}
    final: dict[str, Any] = {}
    finish = None
    done = False
    kind = err = None
    status_ok = False
    try:
        timeout = aiohttp.ClientTimeout(total=params.timeout_s, sock_read=params.stall_s)
        async with session.post(url, json=body, timeout=timeout) as resp:
            if resp.status != 200:
                text = (await resp.text())[:500]
                kind, err = _classify_http(resp.status, text), f"HTTP {resp.status}: {text.strip()}"
            else:
                async for raw in resp.content:
                    now = time.perf_counter_ns()
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        kind, err = "malformed", f"chunk is not JSON: {data[:80]!r}"
                        break
                    if "error" in chunk and not chunk.get("choices"):
                        e = chunk["error"]
                        msg = e.get("message", str(e)) if isinstance(e, dict) else str(e)
                        kind, err = _classify_http(int(e.get("code", 500)) if isinstance(e, dict) else 500, msg), msg
                        break
                    for choice in chunk.get("choices") or ():
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            chunk_times.append(now)
                            if params.keep_text:
                                parts.append(content)
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        final = chunk
                if kind is None:
                    if not done and finish is None:
                        kind, err = "truncated", f"stream ended after {len(chunk_times)} chunks without a finish"
                    elif not chunk_times:
                        kind, err = "empty", "finished without a token"
                    else:
                        status_ok = True
    except asyncio.TimeoutError:
        if chunk_times or time.perf_counter_ns() - t0 < params.timeout_s * 1e9 * 0.99:
            kind, err = "stall", f"no chunk for {params.stall_s:g} s after {len(chunk_times)} chunks"
        else:
            kind, err = "timeout", f"no complete answer within {params.timeout_s:g} s"
    except aiohttp.ClientPayloadError as exc:
        kind, err = "truncated", f"stream broken after {len(chunk_times)} chunks: {exc}"
    except (aiohttp.ClientError, OSError) as exc:
        kind, err = "connection", f"{type(exc).__name__}: {exc}"

    t_end = time.perf_counter_ns()
    n_tokens = int(usage.get("completion_tokens") or len(chunk_times)) if chunk_times else 0
    ttft = (chunk_times[0] - t0) / 1e9 if chunk_times else None
    itl = [(b - a) / 1e9 for a, b in zip(chunk_times, chunk_times[1:])]
    decode_s = (chunk_times[-1] - chunk_times[0]) / 1e9 if len(chunk_times) > 1 else None
    e2e = (t_end - t0) / 1e9
    stats = engine.request_spec_stats(final) if final else None
    return RequestRecord(
        **meta,
        prompt_id=prompt.id,
        status="ok" if status_ok else "error",
        start_unix_s=round(start_unix, 6),
        ttft_s=ttft,
        e2e_s=e2e,
        output_tokens=n_tokens if chunk_times else None,
        chunks=len(chunk_times),
        prompt_tokens=usage.get("prompt_tokens"),
        decode_tps=(n_tokens - 1) / decode_s if decode_s else None,
        e2e_tps=n_tokens / e2e if status_ok and e2e > 0 else None,
        itl_s=[round(x, 7) for x in itl],
        draft_tokens=stats.draft_tokens if stats else None,
        accepted_tokens=stats.accepted_tokens if stats else None,
        finish_reason=finish,
        error_kind=kind,
        error=err,
        text="".join(parts) if params.keep_text else None,
    )


async def run_streams(
    engine: Engine,
    prompts: Sequence[Prompt],
    params: RequestParams,
    streams: int,
    requests_per_stream: int,
    meta: dict[str, Any],
    on_record: Callable[[RequestRecord], None],
    wall_anchor: tuple[float, int],
    prompt_offset: int = 0,
) -> list[RequestRecord]:
    """``streams`` closed-loop streams, each sending ``requests_per_stream`` requests in turn."""
    url = engine.base_url + engine.chat_path
    extras = engine.request_extras()
    records: list[RequestRecord] = []
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one_stream(s: int) -> None:
            for i in range(requests_per_stream):
                prompt = prompts[(prompt_offset + s * requests_per_stream + i) % len(prompts)]
                rec = await stream_one(
                    session, engine, url, prompt, params, extras, {**meta, "stream": s, "index": i}, wall_anchor
                )
                records.append(rec)
                on_record(rec)

        await asyncio.gather(*(one_stream(s) for s in range(streams)))
    return records
