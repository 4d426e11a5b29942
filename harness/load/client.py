"""The streaming client: OpenAI-compatible chat completions, every chunk timestamped.

``StreamParser`` turns SSE lines (with their arrival times) into a ``RequestRecord``; it has no
I/O, so the asyncio client here and the Locust user (harness/load/locustfile.py) share it.
One fresh connection per request: llama-server advertises keep-alive on streamed answers and
then closes the connection, so pooled clients fail requests at random. Failed requests are
records with ``status="error"`` and an ``error_kind``, never exceptions.
Timing definitions: docs/metrics.md#per-request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from engines.base import Engine
from harness.common import jsonsafe
from harness.common.stats import quantile
from harness.prompts import Prompt
from harness.records.files import RequestRecord

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
    "duplicate",  # more text chunks than the engine's usage.completion_tokens: chunks repeated
    "interrupted",  # cut by the harness stopping (SIGTERM/SIGINT, or a records write that failed)
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


def request_body(
    messages: list[dict[str, str]],
    params: RequestParams,
    extras: dict[str, Any],
    seq: int = 0,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The chat request. ``seq`` (the request's position in its phase) varies the seed, so that
    sampled decoding and the engine's synthetic acceptance draw afresh for every request while
    the same position gets the same seed in every configuration (paired comparisons).
    An engine's ``stream_options`` extras are added to ``include_usage``, not put in its place
    (``continuous_usage_stats``: usage in every chunk, so the parser knows each chunk's tokens).
    ``max_tokens``: the prompt's own answer length (synthetic lengths), in place of the scenario's."""
    return {
        "messages": messages,
        "max_tokens": max_tokens if max_tokens is not None else params.max_tokens,
        "temperature": params.temperature,
        "seed": params.seed + seq,
        "stream": True,
        "ignore_eos": params.ignore_eos,
        **extras,
        "stream_options": {"include_usage": True, **(extras.get("stream_options") or {})},
    }


def classify_http(status: int, body: str) -> str:
    low = body.lower()
    if status in (429, 503):
        return "overload"
    if status == 400 and ("context" in low or "exceed" in low):
        return "context_overflow"
    if status >= 500:
        return "server_error"
    return "http_error"


_decode = json.JSONDecoder().decode


def _status(code: Any) -> int:
    """An error chunk's ``code`` as an HTTP status: 500 unless it is one."""
    text = str(code)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 3 else 500


MAX_OUTPUT_TOKENS = 1 << 20  # a running count above this is no count of one answer's tokens


def _count(value: Any) -> int | None:
    """A token count from the engine's usage, or None when it is not a count (a record's count
    fields are integers: the records writer and the report's Parquet schema depend on it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def per_token_gaps(chunk_gaps: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latency (docs/metrics.md): each text chunk after the first spreads
    its gap over the n tokens it carries (gap / n, n times); a chunk carrying no new token (text
    held back from earlier tokens) passes its gap on to the next. ``chunk_gaps`` are the per-chunk
    gaps (a record's ``itl_s``, or nanoseconds), ``tokens`` the tokens of the chunks after the
    first (a record's ``chunk_tokens[1:]``); the result is in the gaps' unit."""
    out: list[float] = []
    carry: float = 0
    for gap, n in zip(chunk_gaps, tokens, strict=False):
        carry += gap
        if n > 0:
            out.extend([carry / n] * n)
            carry = 0
    return out


def _seconds(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e9, 7)


class StreamParser:
    """Accumulates one streamed answer; ``record()`` builds its RequestRecord."""

    def __init__(self, engine: type[Engine] | Engine, keep_text: bool, t0_ns: int):
        self.engine = engine
        self.keep_text = keep_text
        self.t0 = t0_ns
        self.chunk_times: list[int] = []
        # tokens each text chunk carried, from a running count in the chunk itself (None: it had none)
        self.chunk_tokens: list[int | None] = []
        self._counted = 0  # the running count at the last text chunk that carried one
        self.parts: list[str] = []
        self.usage: dict[str, Any] = {}
        self.final: dict[str, Any] = {}
        self.finish: str | None = None
        self.done = False
        self.kind: str | None = None
        self.err: str | None = None
        self._partial = b""

    def fail(self, kind: str, err: str) -> None:
        if self.kind is None:
            self.kind, self.err = kind, err

    def feed_block(self, block: bytes, now_ns: int) -> bool:
        """Bytes as they arrived (any number of lines, the last one possibly cut): every complete
        line is fed with the arrival time of the block; returns False when the stream is over.
        One call per network read, not per line: no per-line awaits or buffers."""
        if self._partial:
            block = self._partial + block
        lines = block.split(b"\n")
        self._partial = lines.pop()
        for line in lines:  # noqa: SIM110  a plain loop on the per-read hot path
            if len(line) > 4 and not self.feed(line, now_ns):  # blank separators skipped without a call
                return False
        return True

    def end_of_block_stream(self, now_ns: int) -> None:
        """The stream ended: feed a last line that came without a newline, then check the end."""
        partial, self._partial = self._partial, b""
        if partial.strip():
            self.feed(partial, now_ns)
        self.end_of_stream()

    def feed(self, raw: bytes, now_ns: int) -> bool:
        """One line of the SSE stream; returns False when the stream is over (done or failed)."""
        line = raw.strip()
        if not line.startswith(b"data:"):
            return True
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return False
        try:
            text = data.decode("utf-8")  # strict UTF-8, as json.loads on bytes
            if jsonsafe.too_deep(text):
                raise jsonsafe.NestedTooDeep("nested too deep")
            chunk = _decode(text)
        except ValueError:
            self.fail("malformed", f"chunk is not JSON: {data[:80]!r}")
            return False
        if not isinstance(chunk, dict):
            self.fail("malformed", f"chunk is not an object: {data[:80]!r}")
            return False
        if "error" in chunk and not chunk.get("choices"):
            e = chunk["error"]
            msg = str(e.get("message") or e) if isinstance(e, dict) else str(e)
            code = _status(e.get("code")) if isinstance(e, dict) else 500
            self.fail(self.engine.classify_error(code, msg) or classify_http(code, msg), msg)
            return False
        usage = chunk.get("usage")
        choices = chunk.get("choices") or []  # llama.cpp's final usage chunk has "choices": []
        if not isinstance(choices, list) or not all(
            isinstance(c, dict) and isinstance(c.get("delta") or {}, dict) for c in choices
        ):
            self.fail("malformed", f"chunk's choices are not a list of objects with a delta object: {data[:80]!r}")
            return False
        if usage and not isinstance(usage, dict):
            self.fail("malformed", f"chunk's usage is not an object: {data[:80]!r}")
            return False
        for choice in choices:
            content = (choice.get("delta") or {}).get("content")
            if content and not isinstance(content, str):
                self.fail("malformed", f"chunk's content is not a string: {data[:80]!r}")
                return False
            if content:
                self.chunk_times.append(now_ns)
                self.chunk_tokens.append(self._tokens_in(chunk, usage))
                if self.keep_text:
                    self.parts.append(content)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        if usage:
            self.usage = usage
            self.final = chunk
        return True

    def _tokens_in(self, chunk: dict[str, Any], usage: Any) -> int | None:
        """Tokens a text chunk carried: the rise of the running output-token count the chunk itself
        reports (``usage.completion_tokens`` when the engine sends usage with every chunk, as vLLM
        and SGLang do with ``stream_options.continuous_usage_stats``; llama.cpp's
        ``timings.predicted_n`` with ``timings_per_token``). None when the chunk reports no count."""
        count = _count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
        if count is None:
            timings = chunk.get("timings")
            count = _count(timings.get("predicted_n")) if isinstance(timings, dict) else None
            if count is None:
                return None
        if count > MAX_OUTPUT_TOKENS:
            return None  # not a count of this answer: per-token figures spread a chunk's gap over each token
        n, self._counted = max(count - self._counted, 0), max(count, self._counted)
        return n

    def tokens_per_chunk(self) -> list[int] | None:
        """Tokens each text chunk carried, or None when the stream does not tell.

        Known when every text chunk reports a running count (``_tokens_in``); else one token per
        chunk when the engine's final ``usage.completion_tokens`` equals the chunk count (a chunk
        carries at least one token, so then each carries exactly one: llama.cpp streams every
        token, drafted and accepted ones included, as its own chunk), or exceeds it by one with
        ``finish_reason: stop`` (the end-of-sequence token is counted but has no text), or when
        there is no usage at all (the chunk count is then the token count); else unknown."""
        n = len(self.chunk_times)
        known = self.chunk_tokens
        if n and None not in known:
            return known  # type: ignore[return-value]  # `None not in known` was checked just above
        reported = _count(self.usage.get("completion_tokens"))
        if reported is None or reported == n or (reported == n + 1 and self.finish == "stop"):
            return [1] * n
        return None

    def end_of_stream(self) -> None:
        if self.kind is None and not self.done and self.finish is None:
            self.fail("truncated", f"stream ended after {len(self.chunk_times)} chunks without a finish")

    def record(self, meta: dict[str, Any], prompt_id: str, start_unix: float, t_end_ns: int) -> RequestRecord:
        ct = self.chunk_times
        ok = self.kind is None and bool(ct)
        if self.kind is None and not ct:
            self.fail("empty", "finished without a token")
        reported = _count(self.usage.get("completion_tokens"))
        if self.kind is None and reported is not None and len(ct) > reported:
            # one chunk carries at least one token: more chunks than tokens means chunks were repeated
            self.fail("duplicate", f"{len(ct)} text chunks but usage.completion_tokens = {reported}")
            ok = False
        n_tokens = (reported or len(ct)) if ct else 0
        decode_s = (ct[-1] - ct[0]) / 1e9 if len(ct) > 1 else None
        per_chunk = self.tokens_per_chunk()
        # tokens that arrived after the first chunk, within t_last - t_first (docs/metrics.md)
        after_first = sum(per_chunk[1:]) if per_chunk is not None else n_tokens - 1
        gaps_ns = [b - a for a, b in itertools.pairwise(ct)]
        token_gaps = sorted(per_token_gaps(gaps_ns, per_chunk[1:])) if per_chunk is not None else []
        e2e = (t_end_ns - self.t0) / 1e9
        stats = self.engine.request_spec_stats(self.final) if self.final else None
        return RequestRecord(
            **meta,
            prompt_id=prompt_id,
            status="ok" if ok else "error",
            start_unix_s=round(start_unix, 6),
            ttft_s=(ct[0] - self.t0) / 1e9 if ct else None,
            e2e_s=e2e,
            output_tokens=n_tokens if ct else None,
            chunks=len(ct),
            prompt_tokens=_count(self.usage.get("prompt_tokens")),
            cached_tokens=_count((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            decode_tps=after_first / decode_s if decode_s else None,
            e2e_tps=n_tokens / e2e if ok and e2e > 0 else None,
            itl_s=[round(g / 1e9, 7) for g in gaps_ns],
            chunk_tokens=per_chunk,
            itl_token_p50_s=_seconds(quantile(token_gaps, 0.5)),
            itl_token_p99_s=_seconds(quantile(token_gaps, 0.99)),
            draft_tokens=stats.draft_tokens if stats else None,
            accepted_tokens=stats.accepted_tokens if stats else None,
            finish_reason=self.finish,
            error_kind=self.kind,
            error=self.err,
            text="".join(self.parts) if self.keep_text else None,
        )


async def stream_one(
    session: aiohttp.ClientSession,
    engine: type[Engine] | Engine,
    url: str,
    prompt: Prompt,
    params: RequestParams,
    extras: dict[str, Any],
    meta: dict[str, Any],
    wall_anchor: tuple[float, int],
    headers: dict[str, str] | None = None,
    seq: int = 0,
) -> RequestRecord:
    """Send one streamed chat request and build its record. Never raises for request failures.

    Cancelled (the harness stopping), it returns the request as failed with kind 'interrupted'.
    """
    body = request_body(prompt.messages, params, extras, seq, prompt.max_tokens)
    anchor_unix, anchor_ns = wall_anchor
    t0 = time.perf_counter_ns()
    parser = StreamParser(engine, params.keep_text, t0)
    try:
        timeout = aiohttp.ClientTimeout(total=params.timeout_s, sock_read=params.stall_s)
        async with session.post(url, json=body, timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:500]
                parser.fail(
                    engine.classify_error(resp.status, text) or classify_http(resp.status, text),
                    f"HTTP {resp.status}: {text.strip()}",
                )
            else:
                more = True
                async for block in resp.content.iter_any():  # one await per network read
                    if not parser.feed_block(block, time.perf_counter_ns()):
                        more = False
                        break
                if more:
                    parser.end_of_block_stream(time.perf_counter_ns())
    except TimeoutError:
        if time.perf_counter_ns() - t0 < params.timeout_s * 1e9 * 0.99:
            parser.fail("stall", f"no chunk for {params.stall_s:g} s after {len(parser.chunk_times)} chunks")
        else:
            parser.fail("timeout", f"no complete answer within {params.timeout_s:g} s")
    except aiohttp.ClientPayloadError as exc:
        parser.fail("truncated", f"stream broken after {len(parser.chunk_times)} chunks: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        parser.fail("connection", f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        parser.fail("interrupted", f"harness stopping: request cut after {len(parser.chunk_times)} chunks")
    return parser.record(meta, prompt.id, anchor_unix + (t0 - anchor_ns) / 1e9, time.perf_counter_ns())


async def race_stop(aw: Any, stop: asyncio.Event) -> asyncio.Future[Any]:
    """Run ``aw`` until it ends or ``stop`` is set, whichever comes first: its task, not done when stop came first."""
    task = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    return task


async def until_stopped(stop: asyncio.Event, request: Any) -> RequestRecord:
    """Await ``request`` (a stream_one coroutine), cutting it when ``stop`` is set: it is then recorded as 'interrupted'."""
    task = await race_stop(request, stop)
    if not task.done():
        task.cancel()  # stream_one records it as 'interrupted'
    return await task


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
    stop: asyncio.Event | None = None,
) -> list[RequestRecord]:
    """``streams`` closed-loop streams, each sending ``requests_per_stream`` requests in turn.

    When ``stop`` is set (or ``on_record`` fails, e.g. a full disk), no new request starts and the
    requests in flight are cut and recorded with error_kind 'interrupted'; then the first error
    of ``on_record``, if any, is raised.
    """
    url = engine.request_url + engine.chat_path
    extras = engine.request_extras()
    headers = engine.request_headers()
    stop = stop if stop is not None else asyncio.Event()
    records: list[RequestRecord] = []
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one_stream(s: int) -> None:
            try:
                for i in range(requests_per_stream):
                    if stop.is_set():
                        return
                    seq = prompt_offset + s * requests_per_stream + i
                    prompt = prompts[seq % len(prompts)]
                    rec = await until_stopped(
                        stop,
                        stream_one(
                            session,
                            engine,
                            url,
                            prompt,
                            params,
                            extras,
                            {**meta, "stream": s, "index": i},
                            wall_anchor,
                            headers,
                            seq,
                        ),
                    )
                    if rec.attempt:
                        rec = dataclasses.replace(rec, id=f"{rec.attempt}/{s}/{i}")
                    records.append(rec)
                    on_record(rec)
            except BaseException:
                stop.set()
                raise

        outcomes = await asyncio.gather(*(one_stream(s) for s in range(streams)), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return records
