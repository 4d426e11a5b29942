"""A failed append (a full disk) leaves no torn record: the file is cut back to where the append began."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Any

import pytest

from harness.common.errors import ResultsError
from harness.records.files import BatchedJsonlWriter, JsonlWriter


class _FillsUp:
    """A file whose next write gets 10 bytes onto the disk, then ENOSPC (what a full filesystem does mid-line)."""

    def __init__(self, f: Any):
        self.f = f

    def write(self, s: str) -> int:
        self.f.write(s[:10])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


@pytest.mark.parametrize("cls", [JsonlWriter, BatchedJsonlWriter])
def test_a_failed_append_leaves_the_file_whole(tmp_path: Path, cls: type[JsonlWriter]) -> None:
    p = tmp_path / "r.jsonl"
    w = cls(p) if cls is JsonlWriter else BatchedJsonlWriter(p, threaded=False)
    w.write({"a": 1})
    if isinstance(w, BatchedJsonlWriter):
        w.flush()
    w._f = _FillsUp(w._f)  # type: ignore[assignment]  # a file that fills up
    with pytest.raises(ResultsError, match="disk full"):  # noqa: PT012  the plain writer fails in write, the batched in flush
        w.write({"b": "x" * 100})
        if isinstance(w, BatchedJsonlWriter):
            w.flush()
    assert p.read_text() == '{"a":1}\n'  # no torn '{"b":"xxx' line
    with contextlib.suppress(ResultsError):  # the batched writer says it again at close
        w.close()
