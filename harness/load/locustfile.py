"""The Locust side of a soak: one streaming user class and one shape. Runs only inside Locust.

Started by harness/load/locust_proc.py as ``python -m locust -f <this file> --headless ...``
(locally, or as a master and workers), with ``SPECSOAK_LOCUST_CONFIG`` naming a JSON file that
says what to send, to whom, for how long, and where to write. Each Locust process appends its
own records (the harness's RequestRecord schema, precise per-chunk timings from
``time.perf_counter_ns``) to ``<records_dir>/<slice>-<pid>.jsonl``; Locust's own statistics,
which round to two significant digits, are only a progress display.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
from locust import LoadTestShape, User, constant, events, task
from locust.exception import StopUser

from engines import engine_class
from harness.client import RequestParams, StreamParser, classify_http, request_body
from harness.load.shapes import users_at
from harness.prompts import Prompt, share_index
from harness.records import BatchedJsonlWriter

CONFIG: dict[str, Any] = json.loads(Path(os.environ["SPECSOAK_LOCUST_CONFIG"]).read_text())
PARAMS = RequestParams(**CONFIG["params"])
PROMPTS = [Prompt.from_dict(p) for p in CONFIG["prompts"]]
BY_ID = {p.id: p for p in PROMPTS}
ENGINE = engine_class(CONFIG["engine"])
_URL = urlsplit(CONFIG["url"])
_SEQ = itertools.count()
_PROMPT_SEQ = itertools.count()
_TRACE_SEQ = itertools.count()
_SEED_SEQ = itertools.count(os.getpid() * 100_003)  # a fresh seed per request, distinct across processes
_WRITER: BatchedJsonlWriter | None = None
_HEADERS = {"Content-Type": "application/json"}
if os.environ.get("SPECSOAK_LOCUST_API_KEY"):  # from the harness's environment, never from the config file
    _HEADERS["Authorization"] = "Bearer " + os.environ["SPECSOAK_LOCUST_API_KEY"]
_ANCHOR = (time.time(), time.perf_counter_ns())
_T_START: float | None = None


def _writer() -> BatchedJsonlWriter:
    """Records go to disk in batches, within 1 s (docs/performance.md#records-on-disk)."""
    global _WRITER
    if _WRITER is None:
        path = Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.jsonl"
        _WRITER = BatchedJsonlWriter(path, max_delay_s=1.0, threaded=False)
        gevent.spawn(_flush_when_due)
    return _WRITER


def _flush_when_due() -> None:
    """A record waits at most ~1 s for the disk even when no other request finishes after it."""
    while _WRITER is not None:
        gevent.sleep(0.25)
        if _WRITER is not None:
            _WRITER.flush_if_due()


@events.quitting.add_listener
def _close(environment: Any, **_kw: Any) -> None:
    global _WRITER
    if _WRITER is not None:
        writer, _WRITER = _WRITER, None
        writer.close()


def _worker_slot(environment: Any) -> tuple[int, int]:
    runner = environment.runner
    index = getattr(runner, "worker_index", None)
    total = int(CONFIG.get("workers") or 1)
    return (int(index) if index is not None and index >= 0 else 0), max(1, total)


_EXHAUSTED = False


def _exhausted(n: int) -> None:
    global _EXHAUSTED
    if _EXHAUSTED:
        return
    _EXHAUSTED = True
    msg = f"specsoak: the soak's {n} prompts are used up (soak.prompt_reuse: forbid): this process's users stop"
    print(msg, file=sys.stderr, flush=True)
    path = Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.exhausted"
    path.write_text(json.dumps({"prompts": n, "unix_s": time.time(), "slice": CONFIG["slice_id"]}) + "\n")
    if _WRITER is not None:
        _WRITER.flush()


class StreamingUser(User):
    """A closed-loop user: one conversation after another, each turn streamed and recorded."""

    wait_time = constant(0)
    _failures_in_a_row = 0

    def on_start(self) -> None:
        global _T_START
        if _T_START is None:
            _T_START = time.perf_counter()

    def _back_off(self, ok: bool) -> None:
        """A closed-loop user must not hammer an engine that is down or loading: back off 0.25 s..5 s."""
        if ok:
            self._failures_in_a_row = 0
            return
        self._failures_in_a_row += 1
        time.sleep(min(5.0, 0.25 * 2 ** (self._failures_in_a_row - 1)))

    @task
    def converse(self) -> None:
        if CONFIG["shape"].get("kind") == "replay":
            prompt = self._next_replay()
        else:
            prompt = self._next_prompt()
        messages = list(prompt.messages)
        for turn, follow in enumerate((None, *prompt.followups)):
            if follow is not None:
                messages = [*messages, {"role": "user", "content": follow}]
            rec = self._one(messages, prompt.id, turn, prompt.max_tokens)
            self._back_off(rec["status"] == "ok")
            if rec["status"] != "ok":
                return
            messages = [*messages, {"role": "assistant", "content": rec.get("text") or ""}]

    def _next_prompt(self) -> Prompt:
        """The next prompt of this process's share: processes take every ``total``-th prompt from their own index
        (past ``prompt_start``, where earlier slices stopped), so no two send the same one. ``prompt_reuse: forbid``:
        a user finding the share used up stops (said once, on stderr and in ``<slice>-<pid>.exhausted`` beside the
        records); ``allow``: the share comes round again."""
        index, total = _worker_slot(self.environment)
        i = share_index(int(CONFIG.get("prompt_start", 0)), next(_PROMPT_SEQ), index, total, len(PROMPTS), CONFIG.get("prompt_reuse", "allow"))
        if i is None:
            _exhausted(len(PROMPTS))
            raise StopUser()
        return PROMPTS[i]

    def _next_replay(self) -> Prompt:
        index, total = _worker_slot(self.environment)
        trace = CONFIG["trace"]
        offset = float(CONFIG.get("offset_s", 0.0))
        while True:
            i = next(_TRACE_SEQ) * total + index
            if i >= len(trace):
                raise StopUser()
            t_s, pid = trace[i]
            if t_s < offset:
                continue  # before this slice (or already sent before a resume)
            break
        assert _T_START is not None
        delay = (t_s - offset) - (time.perf_counter() - _T_START)
        if delay > 0:
            time.sleep(delay)  # gevent-patched: yields to other users
        return BY_ID.get(pid or "", PROMPTS[i % len(PROMPTS)])

    def _one(self, messages: list[dict[str, str]], prompt_id: str, turn: int, max_tokens: int | None = None) -> dict[str, Any]:
        body = json.dumps(request_body(messages, PARAMS, CONFIG["extras"], next(_SEED_SEQ), max_tokens)).encode()
        t0 = time.perf_counter_ns()
        parser = StreamParser(ENGINE, True, t0)
        conn = http.client.HTTPConnection(_URL.hostname or "127.0.0.1", _URL.port or 80, timeout=PARAMS.stall_s)
        deadline = t0 + int(PARAMS.timeout_s * 1e9)
        try:
            conn.request("POST", CONFIG["chat_path"], body=body, headers=_HEADERS)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read(500).decode("utf-8", "replace")
                parser.fail(classify_http(resp.status, text), f"HTTP {resp.status}: {text.strip()}")
            else:
                while True:
                    block = resp.read1(65536)  # what has arrived: one call per network read, not per line
                    now = time.perf_counter_ns()
                    if not block:
                        parser.end_of_block_stream(now)
                        break
                    if not parser.feed_block(block, now):
                        break
                    if now > deadline:
                        parser.fail("timeout", f"no complete answer within {PARAMS.timeout_s:g} s")
                        break
        except (socket.timeout, TimeoutError):
            parser.fail("stall", f"no chunk for {PARAMS.stall_s:g} s after {len(parser.chunk_times)} chunks")
        except http.client.IncompleteRead as exc:
            parser.fail("truncated", f"stream broken after {len(parser.chunk_times)} chunks: {exc!r}")
        except (OSError, http.client.HTTPException) as exc:
            parser.fail("connection", f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
        seq = next(_SEQ)
        meta = {
            "config": CONFIG["config"],
            "phase": "soak",
            "streams": self.environment.runner.user_count if self.environment.runner else 0,
            "repetition": 0,
            "stream": id(self) % 1_000_000,
            "index": seq,
        }
        rec = parser.record(meta, prompt_id, _ANCHOR[0] + (t0 - _ANCHOR[1]) / 1e9, time.perf_counter_ns()).to_dict()
        rec.update(id=f"{CONFIG['slice_id']}/{os.getpid()}/{seq}", attempt=CONFIG["slice_id"], turn=turn)
        if not CONFIG.get("keep_text", False):
            rec["text"] = None
        _writer().write(rec)
        runner = self.environment.runner
        if runner is None or runner.state in ("stopping", "stopped", "cleanup", "quitting"):
            _writer().flush()  # the slice is ending: a worker may be stopped any moment now
        events.request.fire(
            request_type="POST",
            name=CONFIG["config"],
            response_time=(rec["e2e_s"] or 0.0) * 1000.0,
            response_length=rec["output_tokens"] or 0,
            exception=None if rec["status"] == "ok" else RuntimeError(rec["error_kind"]),
            context={},
        )
        if rec["status"] != "ok":
            rec["text"] = None
        else:
            rec["text"] = "".join(parser.parts)
        return rec


class ScenarioShape(LoadTestShape):
    """The scenario's shape (harness/load/shapes.py) for this slice of the soak."""

    def tick(self) -> tuple[int, float] | None:
        t = self.get_run_time()
        if t >= float(CONFIG["slice_s"]):
            return None
        users = users_at(CONFIG["shape"], float(CONFIG.get("offset_s", 0.0)) + t, float(CONFIG["duration_s"]))
        return users, float(CONFIG["shape"].get("spawn_rate", 10.0))
