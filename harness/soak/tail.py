"""Reading files other processes are still writing: the soak's request records (Locust appends them) and the engine's log."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any


class RecordTail:
    """Reads the complete new lines of growing JSONL files."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = defaultdict(int)

    def read(self, files: list[Path]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in files:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.offsets[path] += end + 1
            for line in data[: end + 1].splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


class LogFollower:
    """The engine log's new text since the last read (a log that shrank was replaced: read it from its start), so a
    running-state line is found however many lines the engine wrote after it."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0

    def read(self, path: Path | None, max_bytes: int = 64 * 2**20) -> str:
        if path is None:
            return ""
        if path != self.path:
            self.path, self.offset = path, 0
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                if end < self.offset:
                    self.offset = 0
                f.seek(max(self.offset, end - max_bytes))
                data = f.read(end - f.tell())
        except OSError:
            return ""
        self.offset = end
        return data.decode("utf-8", "replace")
