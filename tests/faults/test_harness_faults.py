"""Harness faults: SIGTERM mid-phase, a full disk, a results folder that cannot be written.

SIGKILL of the harness and resume: tests/integration/test_soak.py (logged to the same ledger).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.helpers import (
    cli,
    engine_child,
    finish,
    gone,
    lines_and_records,
    manifest,
    run_dir,
    scenario,
    start_cli,
    wait_for,
)
from tests.faults.ledger import FaultLog

pytestmark = pytest.mark.engine


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (run the suite as root): {p.stderr.strip()}", pytrace=False)


def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` for a fixture's lifetime (lazily unmounted after)."""
    _mount_tmpfs(where, f"size={size},mode=0755")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    yield from tmpfs(tmp_path / "small", "1m")


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "ro"
    _mount_tmpfs(where, "ro,size=64k")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_sigterm_mid_phase_records_requests_in_flight_stops_engine_writes_reason(
    tmp_path: Path, fault_log: FaultLog
) -> None:
    row = fault_log.inject(
        "harness",
        "SIGTERM mid-phase",
        "SIGTERM to `specsoak run` after the first record, 2 streams",
        "in-flight requests recorded as `interrupted`, engine stopped, manifest `interrupted` with the reason, exit 143",
    )
    results = tmp_path / "results"
    sc = scenario(tmp_path, measurement={"streams": [2], "requests_per_stream": 20})
    proc = start_cli("run", str(sc), "--results", str(results))
    try:
        run = wait_for(lambda: run_dir(results), 60, "the run folder", proc)
        wait_for(lambda: lines_and_records(run / "requests.jsonl")[0] >= 1, 240, "a first record", proc)
        engine = wait_for(lambda: engine_child(proc.pid), 30, "the engine", proc)
        before = {r["id"] for r in lines_and_records(run / "requests.jsonl")[1]}
        os.kill(proc.pid, signal.SIGTERM)
        out = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    assert "Traceback" not in out and "interrupted by SIGTERM" in out
    m = manifest(run)
    assert m["status"] == "interrupted" and "SIGTERM" in m["stop_reason"], m["stop_reason"]
    n_lines, records = lines_and_records(run / "requests.jsonl")
    assert n_lines == len(records) < 40
    assert before <= {r["id"] for r in records}
    interrupted = [r for r in records if r["error_kind"] == "interrupted"]
    assert 1 <= len(interrupted) <= 2, [r["error_kind"] for r in records]
    assert all(r["status"] == "error" and r["e2e_s"] is not None for r in interrupted)
    assert (
        lines_and_records(run / "phases.jsonl")[0] == 0
    )  # the cut phase has no phase record: resume measures it again
    assert gone(engine.pid)
    assert m["configurations"]["baseline"]["engine_exit"] is not None
    row.done(
        f"exit 143; {len(interrupted)} request(s) recorded `interrupted`; engine exit {m['configurations']['baseline']['engine_exit']}; "
        f"stop_reason: {m['stop_reason'][:60]}",
        runs_completed=1,
        samples_lost=len(before - {r["id"] for r in records}),
    )


def test_full_disk_stops_the_run_with_the_reason_keeping_what_was_written(
    tmp_path: Path, small_fs: Path, fault_log: FaultLog
) -> None:
    row = fault_log.inject(
        "harness",
        "results folder on a full filesystem",
        "1 MiB tmpfs, filled to ~200 KiB free before the run",
        "exit 3, the reason in the manifest, every record written kept whole, engine stopped",
    )
    filler = small_fs / "filler"
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    filler.write_bytes(b"x" * (free - 200 * 1024))
    results = small_fs / "results"
    sc = scenario(tmp_path, measurement={"streams": [2], "requests_per_stream": 200})
    proc = start_cli("run", str(sc), "--results", str(results), "--no-report")
    try:
        run = wait_for(lambda: run_dir(results), 60, "the run folder", proc)
        engine = wait_for(lambda: engine_child(proc.pid), 60, "the engine", proc)
        out = finish(proc, 400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out[-3000:]
    assert "Traceback" not in out and "disk full" in out, out[-2000:]
    m = manifest(run)
    assert m["status"] == "failed" and "disk full" in m["stop_reason"], m
    n_lines, records = lines_and_records(run / "requests.jsonl")  # no torn line
    assert n_lines == len(records)
    assert gone(engine.pid)
    row.done(
        f"exit 3 after {len(records)} records; stop_reason: {m['stop_reason'].replace(str(run), 'RUN')[:90]}",
        runs_completed=1,
    )


def test_results_folder_not_writable(read_only_fs: Path, tmp_path: Path, fault_log: FaultLog) -> None:
    row = fault_log.inject(
        "harness",
        "results folder not writable",
        "`--results` on a read-only tmpfs",
        "exit 3, one line naming the folder, nothing started",
    )
    p = cli("run", str(scenario(tmp_path)), "--results", str(read_only_fs))
    assert p.returncode == 3, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert (
        len(lines) == 1
        and lines[0] == f"specsoak: error: cannot create a run folder in {read_only_fs}: Read-only file system"
    ), lines
    row.done(lines[0].replace(str(read_only_fs), "RESULTS"))
