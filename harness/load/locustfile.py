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
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.lock
from locust import LoadTestShape, User, constant, events, task
from locust.exception import StopUser

from engines import engine_class
from harness.load.client import RequestParams, StreamParser, classify_http, request_body
from harness.load.schedule import LATE_AFTER_S, in_flight_share, soak_offsets, worker_share
from harness.load.shapes import users_at
from harness.prompts import Prompt, share_index
from harness.records.files import BatchedJsonlWriter

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
ARRIVAL: dict[str, Any] | None = CONFIG.get("arrival")  # open loop: PacingUser; closed loop: StreamingUser


def _writer() -> BatchedJsonlWriter:
    """Records go to disk in batches, within 1 s (docs/performance.md#records-on-disk)."""
    global _WRITER  # noqa: PLW0603  state of this one Locust process
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
    global _EXHAUSTED  # noqa: PLW0603  state of this one Locust process
    if _EXHAUSTED:
        return
    _EXHAUSTED = True
    msg = f"specsoak: the soak's {n} prompts are used up (soak.prompt_reuse: forbid): this process's users stop"
    print(msg, file=sys.stderr, flush=True)
    path = Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.exhausted"
    path.write_text(json.dumps({"prompts": n, "unix_s": time.time(), "slice": CONFIG["slice_id"]}) + "\n")
    if _WRITER is not None:
        _WRITER.flush()


class _RecordingUser(User):
    """What both users share: one streamed request, timed and recorded (``_one``)."""

    abstract = True
    wait_time = constant(0)
    _failures_in_a_row = 0

    def on_start(self) -> None:
        global _T_START  # noqa: PLW0603  state of this one Locust process
        if _T_START is None:
            _T_START = time.perf_counter()

    def _back_off(self, ok: bool) -> None:
        """A closed-loop user must not hammer an engine that is down or loading: back off 0.25 s..5 s."""
        if ok:
            self._failures_in_a_row = 0
            return
        self._failures_in_a_row += 1
        time.sleep(min(5.0, 0.25 * 2 ** (self._failures_in_a_row - 1)))

    def _next_prompt(self) -> Prompt:
        """The next prompt of this process's share: processes take every ``total``-th prompt from their own index
        (past ``prompt_start``, where earlier slices stopped), so no two send the same one. ``prompt_reuse: forbid``:
        a user finding the share used up stops (said once, on stderr and in ``<slice>-<pid>.exhausted`` beside the
        records); ``allow``: the share comes round again."""
        index, total = _worker_slot(self.environment)
        i = share_index(
            int(CONFIG.get("prompt_start", 0)),
            next(_PROMPT_SEQ),
            index,
            total,
            len(PROMPTS),
            CONFIG.get("prompt_reuse", "allow"),
        )
        if i is None:
            _exhausted(len(PROMPTS))
            raise StopUser()
        return PROMPTS[i]

    def _one(
        self,
        messages: list[dict[str, str]],
        prompt_id: str,
        turn: int,
        max_tokens: int | None = None,
        due: tuple[int, bool] | None = None,
    ) -> dict[str, Any]:
        """One streamed request, recorded. ``max_tokens``: the prompt's own (drawn lengths), else the scenario's.
        ``due``: an open-loop request's scheduled time (perf_counter_ns) and whether it waited for a slot; the record
        then carries scheduled_unix_s, send_delay_s and late."""
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
        except TimeoutError:
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
            "streams": (
                int(ARRIVAL["max_in_flight"])
                if ARRIVAL is not None
                else self.environment.runner.user_count
                if self.environment.runner
                else 0
            ),
            "repetition": 0,
            "stream": id(self) % 1_000_000,
            "index": seq,
        }
        rec = parser.record(meta, prompt_id, _ANCHOR[0] + (t0 - _ANCHOR[1]) / 1e9, time.perf_counter_ns()).to_dict()
        rec.update(id=f"{CONFIG['slice_id']}/{os.getpid()}/{seq}", attempt=CONFIG["slice_id"], turn=turn)
        if due is not None:
            due_ns, waited = due
            delay = max(0.0, (t0 - due_ns) / 1e9)
            rec.update(
                scheduled_unix_s=round(_ANCHOR[0] + (due_ns - _ANCHOR[1]) / 1e9, 6),
                send_delay_s=round(delay, 6),
                late=waited or delay > LATE_AFTER_S,
            )
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


class StreamingUser(_RecordingUser):
    """A closed-loop user: one conversation after another, each turn streamed and recorded."""

    abstract = ARRIVAL is not None  # Locust runs only the user class that is not abstract

    @task
    def converse(self) -> None:
        prompt = self._next_replay() if CONFIG["shape"].get("kind") == "replay" else self._next_prompt()
        messages = list(prompt.messages)
        for turn, follow in enumerate((None, *prompt.followups)):
            if follow is not None:
                messages = [*messages, {"role": "user", "content": follow}]
            rec = self._one(messages, prompt.id, turn, prompt.max_tokens)
            self._back_off(rec["status"] == "ok")
            if rec["status"] != "ok":
                return
            messages = [*messages, {"role": "assistant", "content": rec.get("text") or ""}]

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


class PacingUser(_RecordingUser):
    """The open-loop user: one per Locust process, a scheduler that sends this process's share of the soak's
    arrivals (harness/load/pacing.py) each at its time, each in its own greenlet, at most its share of
    ``max_in_flight`` at once. A request due while every slot is taken waits for one in order, and is recorded late
    with its delay; one the process itself sends past LATE_AFTER_S (a busy CPU) is late too. Never silently delayed."""

    abstract = ARRIVAL is None

    @task
    def converse(self) -> None:
        assert ARRIVAL is not None
        index, total = _worker_slot(self.environment)
        offset, slice_s, duration = (
            float(CONFIG.get("offset_s", 0.0)),
            float(CONFIG["slice_s"]),
            float(CONFIG["duration_s"]),
        )
        offsets = soak_offsets(ARRIVAL, offset, offset + slice_s, duration)
        mine = worker_share(len(offsets), index, total)
        slots = gevent.lock.BoundedSemaphore(in_flight_share(int(ARRIVAL["max_in_flight"]), index, total))
        t0_ns = time.perf_counter_ns()
        # where this process's schedule starts, for the harness's offered rate per window (harness/soak/slice.py)
        start = {
            "t0_unix": _ANCHOR[0] + (t0_ns - _ANCHOR[1]) / 1e9,
            "offset_s": offset,
            "scheduled": len(mine),
            "pid": os.getpid(),
        }
        (Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.pacing.json").write_text(json.dumps(start))
        sent: list[gevent.Greenlet] = []
        for i in mine:
            due_ns = t0_ns + round((float(offsets[i]) - offset) * 1e9)
            wait_s = (due_ns - time.perf_counter_ns()) / 1e9
            if wait_s > 0:
                gevent.sleep(wait_s)
            if _stopping(self.environment):
                break
            try:
                prompt = self._next_prompt()
            except StopUser:  # prompt_reuse: forbid and the share used up (said by _exhausted)
                break
            waited = slots.locked()
            slots.acquire()
            sent.append(gevent.spawn(self._send, prompt, due_ns, waited, slots))
        gevent.joinall(sent)
        raise StopUser()

    def _send(self, prompt: Prompt, due_ns: int, waited: bool, slots: gevent.lock.BoundedSemaphore) -> None:
        try:
            self._one(list(prompt.messages), prompt.id, 0, prompt.max_tokens, (due_ns, waited))
        finally:
            slots.release()


def _stopping(environment: Any) -> bool:
    runner = environment.runner
    return runner is None or runner.state in ("stopping", "stopped", "cleanup", "quitting")


class ScenarioShape(LoadTestShape):
    """The scenario's shape (harness/load/shapes.py) for this slice of the soak; open loop: one pacing user per
    Locust process for the slice."""

    def tick(self) -> tuple[int, float] | None:
        t = self.get_run_time()
        if t >= float(CONFIG["slice_s"]):
            return None
        if ARRIVAL is not None:
            n = max(1, int(CONFIG.get("workers") or 1))
            return n, float(n)
        users = users_at(CONFIG["shape"], float(CONFIG.get("offset_s", 0.0)) + t, float(CONFIG["duration_s"]))
        return users, float(CONFIG["shape"].get("spawn_rate", 10.0))
