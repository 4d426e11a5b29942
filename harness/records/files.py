"""Records written during a run, and the append-only writer that makes them durable.

Each record is one JSON line, flushed and fsynced as it arrives, so a run killed at any
instant keeps every record already written. A torn last line (power loss mid-write) is
skipped on read, never fatal. Schemas: docs/metrics.md (per request, per phase, soak).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common import jsonsafe
from harness.common.errors import ResultsError
from harness.records.types import Manifest

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
PHASES = "phases.jsonl"
FAILURES = "failures.jsonl"
RAMP = "ramp.jsonl"  # the max-streams ramp: one record per stream count tried, then the result
FILL_CHECKS = "fill_checks.jsonl"  # the engine restarted at its servable context and filled
AFTER_SOAK = "after_soak.jsonl"  # the measurement phases again, on each configuration's engine after its soak
SOAK_DIR = "soak"  # the soak's request records, one JSONL file per Locust process and slice
SLICES = "soak_slices.jsonl"  # soak slice starts and ends (what resume reads)
VERDICTS = "verdicts.jsonl"  # watchdog verdicts
WINDOWS = "windows.jsonl"  # watchdog windows: aggregates, detector state
VERIFY = "verify.jsonl"  # specsoak verify: one record per configuration and prompt
VERIFY_DIST = "verify_distribution.jsonl"  # specsoak verify --distribution


@dataclass(frozen=True)
class RequestRecord:
    config: str
    phase: str  # warmup | measure
    streams: int
    repetition: int
    stream: int
    index: int
    prompt_id: str
    status: str  # ok | error
    start_unix_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    chunks: int = 0
    prompt_tokens: int | None = None
    # of them, those the engine took from its prompt cache (the final chunk's usage.prompt_tokens_details.cached_tokens,
    # as llama-server sends it: tests/fixtures/llamacpp/spec_self_draft.chat.stream_usage.sse.txt)
    cached_tokens: int | None = None
    decode_tps: float | None = None
    e2e_tps: float | None = None
    itl_s: list[float] = field(default_factory=list)  # per chunk, after the first
    chunk_tokens: list[int] | None = None  # tokens per text chunk; None: the stream did not tell
    itl_token_p50_s: float | None = None  # per-token ITL (a chunk's gap / its tokens), this request's median
    itl_token_p99_s: float | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    error: str | None = None
    text: str | None = None
    id: str = ""  # unique within the run: resume never duplicates a record
    attempt: str = ""  # the phase attempt (or soak slice) the request belongs to
    turn: int = 0  # 0 for single-turn prompts; n for the n-th follow-up of a conversation
    # open-loop phases (harness/load/arrivals.py) only; None in closed-loop phases and the soak
    scheduled_unix_s: float | None = None  # when the schedule said to send it
    send_delay_s: float | None = None  # start_unix_s - scheduled_unix_s (0 when on time)
    late: bool | None = None  # it waited for a slot (max_in_flight in flight), or went out past LATE_AFTER_S
    queued: bool | None = None  # it waited for a slot: the engine's fault, where a late client send is the harness's

    def to_dict(self) -> dict[str, Any]:
        # shallow (asdict deep-copies every ITL float, ~40 % of a record's cost): the fields are
        # immutable except itl_s and chunk_tokens, which no writer changes
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """A request line read back (requests.jsonl, a soak's JSONL): keys this version does not name are dropped;
        TypeError when a field without a default is missing."""
        return cls(**{k: v for k, v in data.items() if k in _REQUEST_FIELDS})


_REQUEST_FIELDS = frozenset(RequestRecord.__dataclass_fields__)


class JsonlWriter:
    """Append-only JSON lines; each ``write`` is on disk (fsync) before it returns."""

    def __init__(self, path: Path):
        self.path = path
        try:
            _drop_torn_tail(path)
            self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115  closed in close()
        except OSError as exc:
            raise ResultsError(f"cannot write {path}: {exc.strerror}") from exc

    def _append(self, data: str) -> None:
        """Write, flush and fsync ``data``; when that fails (a full disk), cut the file back to where it was, so a
        failed append leaves no torn record behind (what went before stays whole), then raise."""
        start = os.fstat(
            self._f.fileno()
        ).st_size  # everything before is flushed: the file ends where the last append did
        try:
            self._f.write(data)
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                self._f.close()  # drops what the buffer still holds (its flush fails again on a full disk)
            try:
                os.truncate(self.path, start)
                self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  closed in close()
            except OSError:
                pass
            raise

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n"
        try:
            self._append(line)
        except OSError as exc:
            what = "disk full" if exc.errno == errno.ENOSPC else exc.strerror
            raise ResultsError(f"cannot append to {self.path}: {what}; records written before are kept") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """A record cut short by a crash was never written: cut it off before appending again."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        block = 65536
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(start + nl + 1)
                return
            pos = start
        f.truncate(0)


@dataclass
class Skipped:
    """Lines of one file a reader could not use: how many, the first one's number, and why (reason -> lines)."""

    lines: int = 0
    first_line: int = 0
    why: dict[str, int] = field(default_factory=dict)


class ReadLog:
    """What the readers of a folder could not read, per file (the report's notes and stderr say it)."""

    def __init__(self) -> None:
        self.files: dict[Path, Skipped] = {}

    def skip(self, path: Path, line: int, why: str) -> None:
        s = self.files.setdefault(path, Skipped(first_line=line))
        s.lines += 1
        s.why[why] = s.why.get(why, 0) + 1

    def messages(self, root: Path | None = None) -> list[str]:
        out = []
        for path, s in self.files.items():
            name = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
            why = ", ".join(f"{w}: {n}" if len(s.why) > 1 else w for w, n in s.why.items())
            out.append(
                f"{name}: {s.lines} line{'s' if s.lines > 1 else ''} skipped, the first at line {s.first_line} ({why})"
            )
        return out


def read_jsonl(
    path: Path, log: ReadLog | None = None, require: dict[str, type | tuple[type, ...]] | None = None
) -> Iterator[dict[str, Any]]:
    """Every complete record in ``path``. A torn last line, a line that is not a JSON object, or (with
    ``require``: field -> type) a record without those fields of those types is skipped, and told to ``log``."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.endswith("\n"):
                if log is not None and line.strip():
                    log.skip(path, n, "torn last line: cut mid-write")
                break
            try:
                obj = jsonsafe.loads(line)
            except ValueError:  # not JSON, nested too deep, or an integer of over 4300 digits
                if log is not None:
                    log.skip(path, n, "not JSON")
                continue
            if not isinstance(obj, dict):
                if log is not None:
                    log.skip(path, n, "not a JSON object")
                continue
            if require:
                bad = next(
                    (
                        k
                        for k, t in require.items()
                        if not isinstance(obj.get(k), t) or (isinstance(obj.get(k), bool) and bool not in _types(t))
                    ),
                    None,
                )
                if bad is not None:
                    if log is not None:
                        log.skip(path, n, f"field '{bad}' missing or of the wrong type")
                    continue
            yield obj


def _types(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        what = "disk full" if exc.errno == errno.ENOSPC else exc.strerror
        raise ResultsError(f"cannot write {path}: {what}") from exc


class BatchedJsonlWriter(JsonlWriter):
    """Append-only JSON lines written in batches by a writer thread: the caller never waits for a disk.

    The durability rule (docs/performance.md#records-on-disk): a record is serialised when it is
    written (later changes to the object do not reach the disk); a batch goes to the writer thread
    (one write, one fsync) once ``max_records`` are waiting or the oldest waiting record is
    ``max_delay_s`` old when the next one arrives or ``flush_if_due()`` is called; ``flush()`` and
    ``close()`` return only when every record written before them is on disk, and callers call
    them before the phase record or window that counts those records is written. A crash loses
    at most the records of the last ``max_delay_s`` (plus one fsync); a torn batch is cut back to
    its last complete line on the next open, as for JsonlWriter. ``on_durable`` is called with
    each record once it is on disk, on the caller's thread (at its next write or flush): observers
    hear of a record only after the disk has it. A write error of the thread is raised as
    ResultsError by the caller's next write or flush.
    """

    def __init__(
        self,
        path: Path,
        max_delay_s: float = 1.0,
        max_records: int = 256,
        on_durable: Any = None,
        threaded: bool = True,
    ):
        super().__init__(path)
        self.threaded = (
            threaded  # False: batches are written on the caller's thread (gevent: a thread is a greenlet anyway)
        )
        self.max_delay_s = max_delay_s
        self.max_records = max_records
        self.on_durable = on_durable
        self._lines: list[str] = []
        self._records: list[dict[str, Any]] = []
        self._oldest = 0.0
        self._todo: queue.Queue[tuple[str, list[dict[str, Any]]] | None] = queue.Queue()
        self._durable: collections.deque[list[dict[str, Any]]] = collections.deque()
        self._error: ResultsError | None = None
        self._thread = threading.Thread(target=self._run, name=f"records:{path.name}", daemon=True)
        if threaded:
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            try:
                if item is None:
                    return
                data, records = item
                if self._error is None:
                    try:
                        self._append(data)
                        if records:
                            self._durable.append(records)
                    except OSError as exc:
                        what = "disk full" if exc.errno == errno.ENOSPC else exc.strerror
                        self._error = ResultsError(
                            f"cannot append to {self.path}: {what}; records written before are kept"
                        )
            finally:
                self._todo.task_done()

    def write(self, record: dict[str, Any]) -> None:
        self._check()
        if not self._lines:
            self._oldest = time.monotonic()
        self._lines.append(json.dumps(record, separators=(",", ":"), allow_nan=False, default=str))
        if self.on_durable is not None:
            self._records.append(record)
        if len(self._lines) >= self.max_records or time.monotonic() - self._oldest >= self.max_delay_s:
            self._hand_over()
        self._notify()

    def flush_if_due(self) -> None:
        if self._lines and time.monotonic() - self._oldest >= self.max_delay_s:
            self._hand_over()
        self._notify()

    def flush(self) -> None:
        """Every record written so far is on disk when this returns."""
        self._hand_over()
        if self.threaded:
            self._todo.join()
        self._check()
        self._notify()

    def _hand_over(self) -> None:
        if self._lines:
            self._todo.put(("\n".join(self._lines) + "\n", self._records))
            self._lines, self._records = [], []
            if not self.threaded:
                self._todo.put(None)
                self._run()  # writes what is queued, returns at the None

    def _notify(self) -> None:
        while self._durable:
            for r in self._durable.popleft():
                self.on_durable(r)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        try:
            if self._thread.is_alive() or not self.threaded:
                self.flush()
        finally:
            if self._thread.is_alive():
                self._todo.put(None)
                self._thread.join()
            super().close()


def open_request_sink(path: Path, batched: bool = True, on_durable: Any = None) -> JsonlWriter:
    """Where a client's request records go: batched by a writer thread, or (``batched=False``) the
    JsonlWriter's one fsync per record on the caller's thread."""
    return BatchedJsonlWriter(path, on_durable=on_durable) if batched else JsonlWriter(path)


def read_manifest(run_dir: Path) -> Manifest:
    mpath = run_dir / MANIFEST
    if not mpath.is_file():
        raise ResultsError(f"{run_dir}: not a run folder (no {MANIFEST})")
    try:
        data = jsonsafe.loads(mpath.read_text())
    except ValueError as exc:
        raise ResultsError(f"{mpath}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{mpath}: unreadable manifest (not an object)")
    try:
        return Manifest.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ResultsError(f"{mpath}: unreadable manifest ({exc})") from None
