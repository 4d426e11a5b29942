"""Engine output captured with a bound on disk (docs/soak.md#engine-logs).

The engine writes into a pipe that a thread drains into ``logs/<name>.server.log``. That file holds the
start-up section whole (the command line, then everything up to the adapter's ready line, at most
``startup_max_bytes``) followed by the newest output, the live part. When the live part reaches
``segment_bytes`` it moves, cut at a line end, into a gzip segment ``<name>.server.log.<n>.gz``; the
oldest segments are deleted while the start-up section, a full live part and the segments would exceed
``max_bytes``. ``<name>.server.log.index.json`` says where the start-up section ends, which segments
exist and how many bytes were dropped; it is written once the start-up section closes and after each
rotation, so a restarted engine (the soak's watchdog, ``specsoak resume``) continues the same log.

Crash safety: every chunk read from the pipe is written to the main file at once, so an engine killed
mid-segment leaves its output so far in the main file; a segment is written to a temporary file and
renamed before the main file is rewritten (tmp + rename), so a harness killed mid-rotation leaves the
same bytes twice at worst, never none. Engines import nothing from the harness: this lives with them.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIB = 2**20
DEFAULT_LOG_MAX_MIB = 256.0  # per engine log; scenario field report.engine_log_max_mib
STARTUP_MAX_BYTES = 8 * MIB  # the start-up section is kept whole up to this (llama-server: ~200 KB at -lv 4)
SEGMENT_MAX_BYTES = 16 * MIB
SEGMENT_MIN_BYTES = 16 * 1024
TAIL_BYTES = (
    64 * 1024
)  # read_log() always holds at least this much of the newest output (a traceback cut by a rotation)
_READ_BYTES = 64 * 1024
_PIPE_BYTES = MIB  # the kernel's default pipe-max-size: an engine rarely blocks while the thread compresses
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named in the fcntl module only from Python 3.10 on some builds


def index_path(log: Path) -> Path:
    return log.with_name(log.name + ".index.json")


def segment_path(log: Path, n: int) -> Path:
    return log.with_name(f"{log.name}.{n:04d}.gz")


@dataclass(frozen=True)
class LogBound:
    """How much of one engine log stays on disk, in bytes."""

    max_bytes: int
    startup_max_bytes: int
    segment_bytes: int

    @classmethod
    def of_mib(cls, mib: float) -> LogBound:
        """The bound ``mib`` split: start-up section at most half of it (8 MiB at most), segments an eighth (16 KiB–16 MiB)."""
        total = max(int(mib * MIB), 4 * SEGMENT_MIN_BYTES)
        return cls(
            total, min(STARTUP_MAX_BYTES, total // 2), max(SEGMENT_MIN_BYTES, min(SEGMENT_MAX_BYTES, total // 8))
        )


@dataclass
class Segment:
    file: str  # name beside the log
    raw_bytes: int  # engine output it holds (uncompressed)
    gz_bytes: int


@dataclass
class LogIndex:
    """The persisted state of one bounded log (``<log>.index.json``)."""

    startup_bytes: int = 0  # the main file's first startup_bytes are the start-up section(s), kept whole
    segments: list[Segment] = field(default_factory=list)  # oldest first
    next_segment: int = 1
    written_bytes: int = 0  # engine output received, all processes of this log together
    dropped_bytes: int = 0  # engine output deleted to stay under the bound (raw, uncompressed)
    dropped_segments: int = 0
    max_bytes: int = 0
    startups: int = 0  # engine processes that wrote to this log

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, log: Path) -> LogIndex | None:
        """The index beside ``log``, or None when there is none (a log that never closed its start-up section)
        or it cannot be read."""
        try:
            d = json.loads(index_path(log).read_text(encoding="utf-8"))
            d["segments"] = [Segment(**s) for s in d.get("segments") or []]
            return cls(**d)
        except (OSError, ValueError, TypeError):
            return None

    def write(self, log: Path) -> None:
        _write_atomic(index_path(log), json.dumps(self.to_dict(), indent=1).encode())

    def kept_bytes(self) -> int:
        return sum(s.gz_bytes for s in self.segments)


def _write_atomic(path: Path, data: bytes, sync: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class BoundedLog:
    """The drain thread of one engine process and the files it writes. ``pipe()`` gives the engine's stdout,
    ``started()`` (after the process is spawned) starts draining, ``mark_ready()`` closes the start-up section for an
    engine without a ready line, ``close()`` waits for the engine's last output."""

    def __init__(self, path: Path, bound: LogBound, ready_line: re.Pattern[bytes] | None = None, header: bytes = b""):
        self.path = path
        self.bound = bound
        self.ready_line = ready_line
        self.header = header
        self.index = LogIndex(max_bytes=bound.max_bytes)
        self.prefix = b""  # the main file's start-up section(s), as on disk
        self.in_startup = True
        self.live_bytes = 0  # bytes after the prefix in the main file
        self._pending = b""  # start-up bytes after the last complete line (the ready line may not be whole yet)
        self._ready = threading.Event()
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self.error: str | None = (
            None  # why the thread stopped writing (a full disk): the engine's output is then discarded
        )

    # ---- life ------------------------------------------------------------------------
    def pipe(self) -> int:
        """Open the log (continuing an existing one) and return the write end of the engine's stdout pipe."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open_existing()
        self._read_fd, self._write_fd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._write_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        self.index.startups += 1
        if self.in_startup:
            self._startup_write(self.header)
        else:
            self._take(self.header)
        return self._write_fd

    def started(self) -> None:
        """The engine holds the write end now: close ours (EOF comes when the engine's last process exits) and drain."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        self._thread = threading.Thread(target=self._drain, name=f"log-{self.path.name}", daemon=True)
        self._thread.start()

    def mark_ready(self) -> None:
        """The engine answers its health check: for an engine without a ready line, the start-up section ends here."""
        self._ready.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for the drain thread to see EOF (the engine is gone), then write the index."""
        if self._write_fd is not None:  # the engine never started
            os.close(self._write_fd)
            self._write_fd = None
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # a child of the engine still holds the pipe: the daemon thread keeps draining it
        elif self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        try:
            self._flush_pending()
            self._finish()
        except OSError as exc:  # a full disk: the log ends where it could; stopping the engine must not fail on it
            self.error = self.error or f"engine log {self.path}: {exc.strerror or exc}"

    # ---- the drain thread ------------------------------------------------------------
    def _drain(self) -> None:
        assert self._read_fd is not None
        try:
            while True:
                chunk = os.read(self._read_fd, _READ_BYTES)
                if not chunk:
                    break
                if self.error is not None:
                    continue  # keep the pipe drained (the engine must never block on its stdout); the bytes are lost
                try:
                    self._take(chunk)
                except OSError as exc:
                    self.error = f"engine log {self.path}: {exc.strerror or exc}"
        finally:
            os.close(self._read_fd)
            self._read_fd = None
            with contextlib.suppress(OSError):
                self._flush_pending()
                self._finish()

    def _take(self, chunk: bytes) -> None:
        self.index.written_bytes += len(chunk)
        if self.in_startup:
            chunk = self._startup_take(chunk)
        while chunk:
            room = self.bound.segment_bytes - self.live_bytes
            if room <= 0:
                self._rotate()
                continue
            piece, chunk = chunk[:room], chunk[room:]
            self._append(piece)
            self.live_bytes += len(piece)
        if self.live_bytes >= self.bound.segment_bytes:
            self._rotate()

    def _startup_take(self, chunk: bytes) -> bytes:
        """Keep start-up bytes up to the end of the ready line (or the cap, or mark_ready); return what comes after."""
        data = self._pending + chunk
        self._pending = b""
        end: int | None = None
        if self.ready_line is not None:
            m = self.ready_line.search(data)
            if m is not None:
                nl = data.find(b"\n", m.end())
                if nl < 0:
                    self._pending = data  # the ready line is not whole yet
                    return b""
                end = nl + 1
        elif self._ready.is_set():
            end = len(data)
        room = self.bound.startup_max_bytes - len(self.prefix)
        if end is None and len(data) <= room:
            whole = data.rfind(b"\n") + 1  # a line that is not whole waits in pending: it may be the ready line
            self._startup_write(data[:whole])
            self._pending = data[whole:]
            return b""
        end = room if end is None else min(end, room)
        self._startup_write(data[:end])
        self._close_startup()
        return data[end:]

    def _startup_write(self, data: bytes) -> None:
        if not data:
            return
        self._append(data)
        self.prefix += data

    def _close_startup(self) -> None:
        self.in_startup = False
        self.index.startup_bytes = len(self.prefix)
        self.index.write(self.path)

    def _flush_pending(self) -> None:
        """An engine that ended inside its start-up section: its last line (no newline) is written as is."""
        if self._pending:
            data, self._pending = self._pending, b""
            self._append(data)
            self.live_bytes += len(data)

    def _append(self, data: bytes) -> None:
        if self._file is None:
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115  closed in _finish or on rotation
        self._file.write(data)

    def _finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self.in_startup or self.index.segments or index_path(self.path).exists():
            self.index.startup_bytes = len(self.prefix)
            self.index.write(self.path)

    # ---- rotation --------------------------------------------------------------------
    def _open_existing(self) -> None:
        """Continue a log an earlier process of this configuration wrote: its start-up section stays, its live part
        becomes a segment, and this process's start-up section follows the earlier ones (while under the cap)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        old = LogIndex.read(self.path)
        if old is not None:
            self.index = old
            self.index.max_bytes = self.bound.max_bytes
            keep = min(old.startup_bytes, len(data))
        else:
            keep = min(len(data), self.bound.startup_max_bytes)
            if keep < len(data):
                keep = data.rfind(b"\n", 0, keep) + 1 or keep
        self.prefix = data[:keep]
        self.live_bytes = len(data) - keep
        if self.live_bytes:
            self._rotate(data[keep:])
        if len(self.prefix) >= self.bound.startup_max_bytes:
            self.in_startup = False  # earlier start-ups fill the section: this one's output is live from its first line

    def _rotate(self, live: bytes | None = None) -> None:
        """Move the live part (cut after its last whole line) into a new gzip segment, then drop the oldest segments."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if live is None:
            with open(self.path, "rb") as f:
                f.seek(len(self.prefix))
                live = f.read()
        cut = live.rfind(b"\n") + 1
        if cut < len(live) // 2:
            cut = len(live)  # no line end in its second half: cut where it is
        seg = segment_path(self.path, self.index.next_segment)
        packed = gzip.compress(live[:cut], compresslevel=6, mtime=0)
        _write_atomic(seg, packed, sync=True)
        self.index.segments.append(Segment(seg.name, cut, len(packed)))
        self.index.next_segment += 1
        self._drop_oldest()
        self.index.startup_bytes = len(self.prefix)
        self.index.write(self.path)
        _write_atomic(self.path, self.prefix + live[cut:])
        self.live_bytes = len(live) - cut

    def _drop_oldest(self) -> None:
        b = self.bound
        while self.index.segments and len(self.prefix) + b.segment_bytes + self.index.kept_bytes() > b.max_bytes:
            s = self.index.segments.pop(0)
            with contextlib.suppress(FileNotFoundError):
                (self.path.parent / s.file).unlink()
            self.index.dropped_bytes += s.raw_bytes
            self.index.dropped_segments += 1


def read_bounded(path: Path) -> str:
    """A bounded log as the parsers read it: the main file (start-up section, newest output) and, when the newest
    output is shorter than TAIL_BYTES after a rotation, the end of the newest segment before it, so a traceback that a
    rotation cut in two reads whole. '' when the file cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    idx = LogIndex.read(path)
    if idx is not None and idx.segments and len(data) - idx.startup_bytes < TAIL_BYTES:
        try:
            seg = gzip.decompress((path.parent / idx.segments[-1].file).read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile):
            seg = b""
        tail = seg[-(TAIL_BYTES - (len(data) - idx.startup_bytes)) :]
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else tail
        data = data[: idx.startup_bytes] + tail + data[idx.startup_bytes :]
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class LogSummary:
    """One bounded log of a run folder, as the manifest and the report say it."""

    log: str  # relative to the run folder
    written_bytes: int
    kept_bytes: int  # on disk: main file + segments
    dropped_bytes: int
    segments: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise_logs(run_dir: Path) -> list[LogSummary]:
    """Every engine log under ``run_dir/logs`` that rotated (has an index), with what it wrote, keeps and dropped."""
    out = []
    for idx_file in sorted((run_dir / "logs").glob("*.index.json")):
        log = idx_file.with_name(idx_file.name.removesuffix(".index.json"))
        idx = LogIndex.read(log)
        if idx is None:
            continue
        main = log.stat().st_size if log.exists() else 0
        out.append(
            LogSummary(
                str(log.relative_to(run_dir)),
                idx.written_bytes,
                main + idx.kept_bytes(),
                idx.dropped_bytes,
                len(idx.segments),
            )
        )
    return out
