"""A soak whose results disk fills up (another writer on the same small filesystem) stops with a 'disk' verdict before
the disk is full: exit 4, every record whole, the report built from the folder afterwards (docs/soak.md#disk-space)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.records.files import read_jsonl
from tests.faults.helpers import cli, finish, lines_and_records, start_cli, wait_for
from tests.faults.test_harness_faults import tmpfs
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
MIB = 2**20
MIN_FREE_MIB = 8


@pytest.fixture
def fs_32m(tmp_path: Path) -> Iterator[Path]:
    yield from tmpfs(tmp_path / "disk", "32m")


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_filling_results_disk_stops_the_soak_with_a_disk_verdict_before_it_is_full(
    tmp_path: Path, fs_32m: Path
) -> None:
    data = {
        "name": "disk",
        "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 4,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": {
            "duration_s": 600,
            "shape": {"kind": "steady", "users": 1},
            "max_tokens": 8,
            "watchdog": {"window_s": 3, "disk_min_free_mib": MIN_FREE_MIB},
        },
        "report": {"engine_log_max_mib": 1},
    }
    path = tmp_path / "disk.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = fs_32m / "results"
    proc = start_cli("run", str(path), "--results", str(results), "--no-report")
    lowest = [_free(fs_32m)]
    stop = threading.Event()

    def fill() -> None:  # another writer on the results disk: 1 MiB every 0.5 s while the soak runs, up to the last MiB
        with open(fs_32m / "filler", "wb") as f:
            while not stop.is_set() and _free(fs_32m) > 2 * MIB:
                f.write(b"x" * MIB)
                f.flush()
                lowest.append(_free(fs_32m))
                time.sleep(0.5)

    filler = threading.Thread(target=fill)
    try:
        run = wait_for(
            lambda: next(results.glob("*-disk"), None) if results.exists() else None, 60, "the run folder", proc
        )
        wait_for((run / "soak_slices.jsonl").exists, 240, "the soak to start", proc)
        filler.start()
        out = finish(proc, 300)
    finally:
        stop.set()
        if filler.is_alive():
            filler.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 4, out[-3000:]
    assert "Traceback" not in out
    # the disk and nothing else: the engine stayed healthy while another writer filled the results disk
    [verdict] = list(read_jsonl(run / "verdicts.jsonl"))
    assert verdict["kind"] == "disk", verdict
    assert verdict["action"] == "stop_run" and verdict["evidence"]["free_mib"] > 0, verdict
    assert "disk full" not in out  # the harness itself never met ENOSPC: it stopped first
    for f in [run / "requests.jsonl", *(run / "soak").glob("*.jsonl"), run / "windows.jsonl", run / "verdicts.jsonl"]:
        n_lines, records = lines_and_records(f)
        assert n_lines == len(records), f"{f.name}: a torn line"
    assert sum(1 for f in (run / "soak").glob("*.jsonl") for _ in read_jsonl(f)) > 0
    (fs_32m / "filler").unlink()  # room for the report: it is rebuilt from the folder alone
    rep = cli("report", str(run))
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "disk" in (run / "report.md").read_text()
