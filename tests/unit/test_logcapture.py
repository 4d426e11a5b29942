"""The bounded engine log (engines/logcapture.py) with a fake engine: a Python process writing fast."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from engines.base import Engine
from engines.logcapture import TAIL_BYTES, BoundedLog, LogBound, LogIndex, read_bounded, summarise_logs
from engines.types import Capacity, EngineCounters, LaunchSpec

BOUND_MIB = 0.25
STARTUP_LINES = 200

# start-up lines, the ready line, then numbered lines as fast as it can; FATAL at the end, or MARK and a wait (to be killed)
FAKE = r"""
import os, sys, time
out = sys.stdout
for i in range(%(startup)d):
    out.write(f"startup {i:05d} capacity line of the fake engine\n")
out.write("fake: listening on http://127.0.0.1:1\n")
out.flush()
for i in range(%(lines)d):
    out.write(f"req {i:08d} update: - cache state: {i %% 97} prompts, 12.345 MiB {os.urandom(12).hex()}\n")
out.write("%(last)s\n")
out.flush()
if "%(last)s" == "MARK":
    time.sleep(60)
sys.exit(1)
"""


class FakeEngine(Engine):
    name = "fake"
    methods = frozenset({"none"})
    ready_line: ClassVar[re.Pattern[bytes] | None] = re.compile(rb"fake: listening on ")
    script = ""

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        return Capacity(slots=sum(1 for ln in text.splitlines() if ln.startswith("startup ")))

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        return EngineCounters()

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        return next((ln.removeprefix("FATAL: ") for ln in log_text.splitlines() if ln.startswith("FATAL: ")), None)

    def check_speculation(self) -> None:
        return None


def fake(tmp_path: Path, lines: int, last: str, bound_mib: float = BOUND_MIB) -> FakeEngine:
    eng = FakeEngine(LaunchSpec(model=tmp_path / "m", log_max_mib=bound_mib), tmp_path / "logs" / "cfg.soak.server.log")
    eng.script = FAKE % {"startup": STARTUP_LINES, "lines": lines, "last": last}
    return eng


def on_disk(log: Path) -> int:
    """Bytes the log takes now: main file, segments and a rotation's temporary files (not the small index)."""
    total = 0
    for p in log.parent.glob(log.name + "*"):
        if not p.name.endswith((".json", ".json.tmp")):
            with contextlib.suppress(FileNotFoundError):  # renamed or dropped by a rotation meanwhile
                total += p.stat().st_size
    return total


def numbers(text: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^req (\d{8}) ", text, re.M)]


def kept_requests(log: Path) -> list[int]:
    """The numbered lines still on disk, oldest first: the segments in order, then the main file's live part."""
    idx = LogIndex.read(log)
    assert idx is not None
    out: list[int] = []
    for s in idx.segments:
        out += numbers(gzip.decompress((log.parent / s.file).read_bytes()).decode())
    return out + numbers(log.read_bytes()[idx.startup_bytes :].decode())


def test_the_log_stays_under_its_bound_with_the_start_up_section_whole(tmp_path: Path) -> None:
    eng = fake(tmp_path, lines=40_000, last="FATAL: out of cheese")  # ~4.5 MB of output into a 0.25 MiB bound
    eng.start()
    sizes = []
    while eng.proc is not None and eng.proc.poll() is None:
        sizes.append(on_disk(eng.log_path))
        time.sleep(0.01)
    eng.stop(5)
    bound = LogBound.of_mib(BOUND_MIB)
    # between rotations under the bound; while one runs, its new segment and the live part it holds are both on disk
    assert max(sizes) <= bound.max_bytes + bound.segment_bytes, (
        f"engine log took {max(sizes)} bytes on disk, bound {bound.max_bytes}"
    )
    assert on_disk(eng.log_path) <= bound.max_bytes

    text = eng.log_path.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# [") and lines[STARTUP_LINES + 1] == "fake: listening on http://127.0.0.1:1"
    assert list(lines[1 : STARTUP_LINES + 1]) == [
        f"startup {i:05d} capacity line of the fake engine" for i in range(STARTUP_LINES)
    ]
    assert eng.capacity().slots == STARTUP_LINES  # the capacity parser reads the whole start-up section
    assert eng.failure_reason(eng.read_log()) == "out of cheese"  # the last line is read after the rotations

    idx = LogIndex.read(eng.log_path)
    assert idx is not None and idx.dropped_bytes > 0 and idx.dropped_segments > 0 and idx.segments
    kept = kept_requests(eng.log_path)
    assert kept == list(range(kept[0], 40_000)), "the newest output is kept without a gap"
    live = len(eng.log_path.read_bytes()) - idx.startup_bytes
    after_startup = idx.written_bytes - (idx.startup_bytes - len(lines[0]) - 1)
    assert idx.dropped_bytes + sum(s.raw_bytes for s in idx.segments) + live == after_startup, (
        "every byte is kept or counted as dropped"
    )
    [summary] = summarise_logs(tmp_path)
    assert summary.log == "logs/cfg.soak.server.log" and summary.dropped_bytes == idx.dropped_bytes
    assert summary.kept_bytes == on_disk(eng.log_path)


def test_an_engine_killed_mid_segment_leaves_its_output_so_far(tmp_path: Path) -> None:
    eng = fake(tmp_path, lines=7_000, last="MARK")
    eng.start()
    deadline = time.monotonic() + 30
    while "\nMARK\n" not in eng.read_log():
        assert time.monotonic() < deadline, "the fake engine's MARK never reached the log"
        time.sleep(0.05)
    assert eng.proc is not None
    os.killpg(eng.proc.pid, signal.SIGKILL)  # mid-segment: the live part is not a segment yet
    eng.stop(0)
    idx = LogIndex.read(eng.log_path)
    assert idx is not None and idx.segments
    live = eng.log_path.read_bytes()[idx.startup_bytes :].decode()
    assert live.endswith("MARK\n") and 0 < len(live) < LogBound.of_mib(BOUND_MIB).segment_bytes
    kept = kept_requests(eng.log_path)
    assert kept[-1] == 6_999 and kept == list(range(kept[0], 7_000))
    for s in idx.segments:  # every segment whole
        gzip.decompress((eng.log_path.parent / s.file).read_bytes())


def test_a_restarted_engine_continues_the_log(tmp_path: Path) -> None:
    first = fake(tmp_path, lines=5_000, last="FATAL: first")
    first.start()
    assert first.proc is not None
    first.proc.wait(30)
    first.stop(0)
    second = fake(tmp_path, lines=100, last="FATAL: second")
    second.start()
    assert second.proc is not None
    second.proc.wait(30)
    second.stop(0)
    text = second.log_path.read_text()
    assert text.count("\nfake: listening on") == 2, "both start-up sections are kept"
    assert second.capacity().slots == 2 * STARTUP_LINES
    assert second.failure_reason(second.read_log()) == "first"  # the parser's rule: the first FATAL line it sees
    idx = LogIndex.read(second.log_path)
    assert idx is not None and idx.startups == 2
    assert "FATAL: second" in second.log_path.read_text() and "FATAL: first" not in text[idx.startup_bytes :]
    kept = kept_requests(second.log_path)
    assert kept[-100:] == list(range(100)) and kept[-101] == 4_999, "the first process's live part became a segment"


def test_a_traceback_cut_by_a_rotation_reads_whole(tmp_path: Path) -> None:
    log = tmp_path / "e.server.log"
    capture = BoundedLog(log, LogBound.of_mib(BOUND_MIB), re.compile(rb"ready"), b'# ["engine"]\n')
    fd = os.dup(capture.pipe())
    capture.started()
    os.write(fd, b"start\nready\n")
    seg = capture.bound.segment_bytes
    live = seg - 60  # the traceback's first lines end inside the first segment, the rest after it
    os.write(fd, (b"x" * 99 + b"\n") * (live // 100) + b"x" * (live % 100 - 1) + b"\n")
    os.write(fd, b'Traceback (most recent call last):\n  File "a.py"\n')
    os.write(fd, b"  more\nValueError: the end\n" + b"y" * 99 + b"\n")
    os.close(fd)
    capture.close()
    idx = LogIndex.read(log)
    assert idx is not None and len(idx.segments) == 1
    assert "Traceback" not in log.read_text()  # the rotation cut the traceback in two
    text = read_bounded(log)
    assert text.startswith('# ["engine"]\nstart\nready\n')
    assert 'Traceback (most recent call last):\n  File "a.py"\n  more\nValueError: the end\n' in text
    assert len(text) <= idx.startup_bytes + TAIL_BYTES


def test_a_start_up_without_its_ready_line_is_cut_at_its_cap(tmp_path: Path) -> None:
    log = tmp_path / "e.server.log"
    bound = LogBound.of_mib(BOUND_MIB)
    capture = BoundedLog(log, bound, re.compile(rb"never printed"))
    fd = os.dup(capture.pipe())
    capture.started()
    for _ in range(bound.max_bytes // 25):
        os.write(fd, os.urandom(24).hex().encode() + b"\n")
    os.close(fd)
    capture.close()
    idx = LogIndex.read(log)
    assert idx is not None and idx.startup_bytes == bound.startup_max_bytes and idx.dropped_bytes > 0
    assert on_disk(log) <= bound.max_bytes


@pytest.mark.parametrize("mib", [0.0625, 1, 256, 100_000])
def test_the_bound_split(mib: float) -> None:
    b = LogBound.of_mib(mib)
    assert (
        b.startup_max_bytes + b.segment_bytes < b.max_bytes
        and b.segment_bytes <= 16 * 2**20
        and b.startup_max_bytes <= 8 * 2**20
    )
