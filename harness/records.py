"""Records written during a run, and the append-only writer that makes them durable.

Each record is one JSON line, flushed and fsynced as it arrives, so a run killed at any
instant keeps every record already written. A torn last line (power loss mid-write) is
skipped on read, never fatal. Schemas: docs/metrics.md#records.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ResultsError

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
PHASES = "phases.jsonl"
FAILURES = "failures.jsonl"


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
    decode_tps: float | None = None
    e2e_tps: float | None = None
    itl_s: list[float] = field(default_factory=list)  # per chunk, after the first
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    error: str | None = None
    text: str | None = None
    id: str = ""  # unique within the run: resume never duplicates a record
    attempt: str = ""  # the phase attempt (or soak slice) the request belongs to
    turn: int = 0  # 0 for single-turn prompts; n for the n-th follow-up of a conversation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JsonlWriter:
    """Append-only JSON lines; each ``write`` is on disk (fsync) before it returns."""

    def __init__(self, path: Path):
        self.path = path
        try:
            _drop_torn_tail(path)
            self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise ResultsError(f"cannot write {path}: {exc.strerror}") from exc

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n"
        try:
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as exc:
            what = "disk full" if exc.errno == errno.ENOSPC else exc.strerror
            raise ResultsError(f"cannot append to {self.path}: {what}; records written before are kept") from exc

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass

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


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record in ``path``; a torn or corrupt line is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


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
        raise ResultsError(f"cannot write {path}: {exc.strerror}") from exc
