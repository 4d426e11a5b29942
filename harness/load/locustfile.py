"""The Locust side of a soak: one streaming user class and one shape. Runs only inside Locust.

Started by harness/load/locust_proc.py as ``python -m locust -f <this file> --headless ...``
(locally, or as a master and workers), with ``SPECSOAK_LOCUST_CONFIG`` naming a JSON file that
says what to send, to whom, for how long, and where to write. Each Locust process appends its
own records (the harness's RequestRecord schema, precise per-chunk timings from
``time.perf_counter_ns``) to ``<records_dir>/<slice>-<pid>.jsonl``; Locust's own statistics,
which round to two significant digits, are only a progress display.

A worker on another host (``soak.remote_workers``, started by ``specsoak worker``) has no such file and shares no
disk or clock with the harness: it asks the master for the config, measures its clock against the master's, starts
its share at the master's common start, and ships its records and files back to the master, times on the master's clock (harness/load/workers.py;
docs/fleet.md#locust-workers-on-other-hosts).
"""

from __future__ import annotations

import contextlib
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
import gevent.event
import gevent.lock
import gevent.queue
from locust import LoadTestShape, User, constant, events, task
from locust.exception import StopUser
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from engines import engine_class
from harness.load.client import RequestParams, StreamParser, classify_http, request_body
from harness.load.schedule import LATE_AFTER_S, in_flight_share, soak_offsets, worker_share
from harness.load.shapes import users_at
from harness.load.workers import FILE_NAME, WorkerBook, clock_offset, safe_host, to_master_clock
from harness.prompts import Prompt, share_index
from harness.records.files import BatchedJsonlWriter

CONFIG: dict[str, Any] = {}
PARAMS: RequestParams
PROMPTS: list[Prompt] = []
BY_ID: dict[str, Prompt] = {}
ENGINE: Any = None
_URL = urlsplit("")
ARRIVAL: dict[str, Any] | None = None  # open loop: PacingUser; closed loop: StreamingUser
# a worker on another host: no config file; config, clock and records go through the master
REMOTE = not os.environ.get("SPECSOAK_LOCUST_CONFIG")
_READY = gevent.event.Event()  # the config is here
_CLOCK = gevent.event.Event()  # remote: the clock offset is measured
_OFFSET_S = 0.0  # remote: this host's clock - the master's
_T0_MASTER: list[float] = []  # remote: when the slice's schedule starts, on the master's clock
_T0_SET = gevent.event.Event()
# the common start is this long after the master's start: for the config and the clock to reach every worker
T0_LEAD_S = 2.0
_HOST = safe_host(socket.gethostname())


def _configure(cfg: dict[str, Any]) -> None:
    """The slice's config, from the harness's file (here) or from the master (a remote worker)."""
    global PARAMS, ENGINE, _URL, ARRIVAL  # noqa: PLW0603  state of this one Locust process
    CONFIG.clear()
    CONFIG.update(cfg)
    PARAMS = RequestParams(**CONFIG["params"])
    PROMPTS[:] = [Prompt.from_dict(p) for p in CONFIG["prompts"]]
    BY_ID.clear()
    BY_ID.update({p.id: p for p in PROMPTS})
    ENGINE = engine_class(CONFIG["engine"])
    _URL = urlsplit(CONFIG["url"])
    ARRIVAL = CONFIG.get("arrival")
    _READY.set()


if not REMOTE:
    _configure(json.loads(Path(os.environ["SPECSOAK_LOCUST_CONFIG"]).read_text()))
_SEQ = itertools.count()
_PROMPT_SEQ = itertools.count()
_TRACE_SEQ = itertools.count()
_SEED_SEQ = itertools.count(os.getpid() * 100_003)  # a fresh seed per request, distinct across processes
_WRITER: BatchedJsonlWriter | _ToMaster | None = None
_RUNNER: list[Any] = []  # this process's Locust runner (events.init)
_HEADERS = {"Content-Type": "application/json"}
if os.environ.get("SPECSOAK_LOCUST_API_KEY"):  # from the harness's environment, never from the config file
    _HEADERS["Authorization"] = "Bearer " + os.environ["SPECSOAK_LOCUST_API_KEY"]
_ANCHOR = (time.time(), time.perf_counter_ns())
_T_START: float | None = None


class _ToMaster:
    """A remote worker's records, shipped to the master in batches within 1 s, their times on the master's clock
    (the master appends them to ``<records_dir>/<slice>-<host>-<pid>.jsonl``)."""

    def __init__(self, runner: Any, max_delay_s: float = 1.0):
        self.runner = runner
        self.max_delay_s = max_delay_s
        self.batch: list[dict[str, Any]] = []
        self.oldest = 0.0

    def write(self, rec: dict[str, Any]) -> None:
        if not self.batch:
            self.oldest = time.monotonic()
        self.batch.append(to_master_clock(rec, _OFFSET_S))

    def flush_if_due(self) -> None:
        if self.batch and time.monotonic() - self.oldest >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.runner.send_message("specsoak_records", {"name": f"{_HOST}-{os.getpid()}", "records": batch})

    def close(self) -> None:
        # quitting: the link to the master may be gone already (test_stop shipped the rest)
        with contextlib.suppress(Exception):
            self.flush()


def _writer() -> BatchedJsonlWriter | _ToMaster:
    """Records go to disk in batches, within 1 s (docs/performance.md#records-on-disk); a remote worker's to the master."""
    global _WRITER  # noqa: PLW0603  state of this one Locust process
    if _WRITER is None:
        if REMOTE:
            _WRITER = _ToMaster(_RUNNER[0])
        else:
            path = Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.jsonl"
            _WRITER = BatchedJsonlWriter(path, max_delay_s=1.0, threaded=False)
        gevent.spawn(_flush_when_due)
    return _WRITER


def _put_file(suffix: str, text: str) -> None:
    """``<records_dir>/<slice>-<pid>.<suffix>`` beside the records; a remote worker's through the master."""
    if REMOTE:
        _RUNNER[0].send_message("specsoak_file", {"name": f"{_HOST}-{os.getpid()}.{suffix}", "text": text})
    else:
        (Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{os.getpid()}.{suffix}").write_text(text)


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
_PACING = False


def _exhausted(n: int) -> None:
    global _EXHAUSTED  # noqa: PLW0603  state of this one Locust process
    if _EXHAUSTED:
        return
    _EXHAUSTED = True
    msg = f"specsoak: the soak's {n} prompts are used up (soak.prompt_reuse: forbid): this process's users stop"
    print(msg, file=sys.stderr, flush=True)
    _put_file(
        "exhausted", json.dumps({"prompts": n, "unix_s": time.time() - _OFFSET_S, "slice": CONFIG["slice_id"]}) + "\n"
    )
    if _WRITER is not None:
        _WRITER.flush()


class _RecordingUser(User):
    """What both users share: one streamed request, timed and recorded (``_one``)."""

    abstract = True
    wait_time = constant(0)
    _failures_in_a_row = 0

    def on_start(self) -> None:
        global _T_START  # noqa: PLW0603  state of this one Locust process
        if not _READY.wait(timeout=60):
            print("specsoak: no config from the master within 60 s: this user stops", file=sys.stderr, flush=True)
            raise StopUser()
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
        who = f"{_HOST}-{os.getpid()}" if REMOTE else str(os.getpid())  # pids repeat across hosts
        rec.update(id=f"{CONFIG['slice_id']}/{who}/{seq}", attempt=CONFIG["slice_id"], turn=turn)
        if due is not None:
            due_ns, waited = due
            delay = max(0.0, (t0 - due_ns) / 1e9)
            rec.update(
                scheduled_unix_s=round(_ANCHOR[0] + (due_ns - _ANCHOR[1]) / 1e9, 6),
                send_delay_s=round(delay, 6),
                late=waited or delay > LATE_AFTER_S,
                queued=waited,
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

    @task
    def converse(self) -> None:
        global _PACING  # noqa: PLW0603  state of this one Locust process
        assert ARRIVAL is not None
        if _PACING:  # one pacer per process: a second (Locust moving a lost worker's user here) would send twice
            raise StopUser()
        _PACING = True
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
        if REMOTE:  # every remote worker starts the schedule at the master's common start, on its own clock
            if not (_T0_SET.wait(timeout=60) and _CLOCK.wait(timeout=60)):
                print("specsoak: no start time or clock from the master: no arrival sent", file=sys.stderr, flush=True)
                raise StopUser()
            t0_ns = _ANCHOR[1] + round((_T0_MASTER[0] + _OFFSET_S - _ANCHOR[0]) * 1e9)
        # where this process's schedule starts (on the master's clock), for the offered rate per window (harness/soak/slice.py)
        start = {
            "t0_unix": _ANCHOR[0] + (t0_ns - _ANCHOR[1]) / 1e9 - _OFFSET_S,
            "offset_s": offset,
            "scheduled": len(mine),
            "pid": os.getpid(),
            "host": _HOST,
        }
        _put_file("pacing.json", json.dumps(start))
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

    def tick(self) -> tuple[int, float, list[type[User]]] | None:
        t = self.get_run_time()
        # remote workers start the schedule T0_LEAD_S after the master: the load runs that much longer to send all of it
        if t >= float(CONFIG["slice_s"]) + (T0_LEAD_S if CONFIG.get("remote") else 0.0):
            return None
        if ARRIVAL is not None:
            n = max(1, int(CONFIG.get("workers") or 1))
            return n, float(n), [PacingUser]
        users = users_at(CONFIG["shape"], float(CONFIG.get("offset_s", 0.0)) + t, float(CONFIG["duration_s"]))
        return users, float(CONFIG["shape"].get("spawn_rate", 10.0)), [StreamingUser]


# ---- workers on other hosts (soak.remote_workers; harness/load/workers.py) ----------------------------------------
_BOOK = WorkerBook()
_WORKERS_LOG: list[Any] = []  # the master's soak/workers/<slice>.jsonl, opened once
_RECORD_FILES: dict[str, Any] = {}
_PONGS: gevent.queue.Queue[tuple[float, float, float]] = gevent.queue.Queue()
CLOCK_PINGS = 8


def _worker_event(event: str, **fields: Any) -> None:
    """One line of soak/workers/<slice>.jsonl: what the master saw of its remote workers (harness/soak/slice.py reads it)."""
    if not _WORKERS_LOG:
        path = Path(CONFIG["records_dir"]) / "workers" / f"{CONFIG['slice_id']}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        _WORKERS_LOG.append(open(path, "a", buffering=1))  # noqa: SIM115  one line per event, kept open for the slice
    _WORKERS_LOG[0].write(json.dumps({"event": event, "t_unix": time.time(), **fields}) + "\n")


def _master_handlers(runner: Any) -> None:
    def on_want_config(environment: Any, msg: Any, **_kw: Any) -> None:
        # asked by the worker once its handlers are in place (a config pushed on connect can arrive before them);
        # the common start goes with it when the load has started already
        runner.send_message("specsoak_config", {"config": CONFIG, "t0": _T0_MASTER[:1]}, client_id=msg.node_id)

    def on_clock(environment: Any, msg: Any, **_kw: Any) -> None:
        runner.send_message("specsoak_clock", {"seq": msg.data["seq"], "t": time.time()}, client_id=msg.node_id)

    def on_hello(environment: Any, msg: Any, **_kw: Any) -> None:
        w = _BOOK.joined(msg.node_id, msg.data, time.time())
        _worker_event("joined", **w.to_dict())

    def on_records(environment: Any, msg: Any, **_kw: Any) -> None:
        name = safe_host(str(msg.data["name"]))
        f = _RECORD_FILES.get(name)
        if f is None:
            path = Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{name}.jsonl"
            f = _RECORD_FILES[name] = open(path, "a")  # noqa: SIM115  closed when the master quits
        recs = msg.data["records"]
        f.write("".join(json.dumps(r) + "\n" for r in recs))
        f.flush()
        _BOOK.shipped(msg.node_id, recs, time.time())

    def on_file(environment: Any, msg: Any, **_kw: Any) -> None:
        name = str(msg.data["name"])
        if not FILE_NAME.match(name):
            print(f"specsoak: a worker sent a file named {name!r}: refused", file=sys.stderr, flush=True)
            return
        text = str(msg.data["text"])
        (Path(CONFIG["records_dir"]) / f"{CONFIG['slice_id']}-{name}").write_text(text)
        if name.endswith(".pacing.json"):
            _BOOK.pacing(msg.node_id, int(json.loads(text)["scheduled"]))

    for kind, fn in (("specsoak_clock", on_clock), ("specsoak_hello", on_hello)):
        runner.register_message(kind, fn)
    runner.register_message("specsoak_records", on_records)
    runner.register_message("specsoak_file", on_file)
    runner.register_message("specsoak_want_config", on_want_config)

    @events.test_start.add_listener
    def _start(environment: Any, **_kw: Any) -> None:
        # the common start of every worker's schedule: late enough for the config and clock to have arrived
        _T0_MASTER[:] = [time.time() + T0_LEAD_S]
        runner.send_message("specsoak_t0", {"t0": _T0_MASTER[0]})
        gevent.spawn(_watch_workers, runner)

    @events.quitting.add_listener
    def _summary(environment: Any, **_kw: Any) -> None:
        if _BOOK.workers:
            _worker_event("summary", workers=_BOOK.summary())
        for f in [*_RECORD_FILES.values(), *_WORKERS_LOG]:
            f.close()


def _watch_workers(runner: Any) -> None:
    """A worker that joined and is gone (missing heartbeats, or quit) while the load runs is lost: said once."""
    while runner.state not in ("stopping", "stopped", "cleanup", "quitting"):
        gevent.sleep(1.0)
        if runner.state not in ("spawning", "running"):
            continue
        present = [cid for cid, c in runner.clients.items() if c.state != STATE_MISSING]
        for w in _BOOK.missing(present, time.time()):
            _worker_event("lost", **w.to_dict())


def _set_t0(t0_master: float) -> None:
    _T0_MASTER[:] = [t0_master]
    _T0_SET.set()


def _remote_worker_handlers(runner: Any) -> None:
    def on_config(environment: Any, msg: Any, **_kw: Any) -> None:
        if msg.data["t0"]:
            _set_t0(float(msg.data["t0"][0]))
        if _READY.is_set():
            return
        _configure(msg.data["config"])
        gevent.spawn(_sync_clock, runner)

    def on_clock(environment: Any, msg: Any, **_kw: Any) -> None:
        _PONGS.put((float(msg.data["seq"]), float(msg.data["t"]), time.time()))

    def on_t0(environment: Any, msg: Any, **_kw: Any) -> None:
        _set_t0(float(msg.data["t0"]))

    runner.register_message("specsoak_config", on_config)
    runner.register_message("specsoak_clock", on_clock)
    runner.register_message("specsoak_t0", on_t0)
    runner.send_message("specsoak_want_config")


def _sync_clock(runner: Any) -> None:
    """This host's clock against the master's (harness/load/workers.py ``clock_offset``), then hello to the master."""
    global _OFFSET_S
    samples: list[tuple[float, float, float]] = []
    for seq in range(CLOCK_PINGS):
        sent = time.time()
        runner.send_message("specsoak_clock", {"seq": seq})
        with contextlib.suppress(gevent.queue.Empty):
            while True:  # an answer to an earlier ping that timed out is passed over
                got_seq, master_t, received = _PONGS.get(timeout=max(0.01, sent + 5.0 - time.time()))
                if int(got_seq) == seq:
                    samples.append((sent, master_t, received))
                    break
    if not samples:
        print("specsoak: the master never answered a clock ping: offset taken as 0", file=sys.stderr, flush=True)
        samples = [(0.0, 0.0, 0.0)]
    _OFFSET_S, rtt = clock_offset(samples)
    _CLOCK.set()
    index = getattr(runner, "worker_index", -1)
    runner.send_message(
        "specsoak_hello",
        {"index": index, "host": socket.gethostname(), "pid": os.getpid(), "clock_offset_s": _OFFSET_S, "rtt_s": rtt},
    )


@events.init.add_listener
def _on_init(environment: Any, **_kw: Any) -> None:
    runner = environment.runner
    _RUNNER[:] = [runner]
    if isinstance(runner, MasterRunner):
        _master_handlers(runner)
    elif isinstance(runner, WorkerRunner) and REMOTE:
        _remote_worker_handlers(runner)


@events.test_stop.add_listener
def _ship(environment: Any, **_kw: Any) -> None:
    """A worker's last records leave before it tells the master it stopped (the master quits on that)."""
    if _WRITER is not None:
        _WRITER.flush()
