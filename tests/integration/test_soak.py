"""Soak on the real llama-server with real Locust: faults survived, resume loses nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness.records.files import RequestRecord, read_jsonl
from tests.faults.helpers import engine_child as _soak_engine
from tests.faults.helpers import finish as _finish
from tests.faults.helpers import start_cli as _start
from tests.faults.helpers import wait_for as _wait_for
from tests.faults.ledger import FaultLog
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
# These tests are about crashes, hangs, resume and records, with 5-s windows of two closed-loop users for 20-45 s:
# fewer windows than the change detector's warm-up, reference and confirmation take (2 + 5 + 2 by default), so a
# healthy engine here gives no verdict but the faults planted (tests/integration/test_soak_gauntlet.py judges a
# stationary soak).


def _scenario(tmp_path: Path, soak: dict[str, Any], configs: list[dict[str, Any]] | None = None) -> Path:
    data = {
        "name": "soak-test",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": configs or [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": soak,
    }
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_dir(results: Path) -> Path | None:
    dirs = list(results.glob("*-soak-test")) if results.exists() else []
    return dirs[0] if dirs else None


def _events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return list(read_jsonl(run_dir / name))


def test_engine_killed_and_paused_mid_soak_are_detected_restarted_and_every_request_recorded(
    tmp_path: Path, fault_log: FaultLog
) -> None:
    rows = [
        fault_log.inject(
            "engine", f"engine {what} mid-soak", how, "watchdog verdict, engine restarted, every request recorded"
        )
        for what, how in (
            ("crashes (SIGKILL)", "SIGKILL to llama-server during a Locust soak"),
            ("hangs (SIGSTOP)", "SIGSTOP to llama-server during a Locust soak"),
        )
    ]
    results = tmp_path / "results"
    soak = {
        # the kill, the restart, the freeze and the second restart take 10-15 s of it here
        "duration_s": 32,
        "shape": {"kind": "steady", "users": 2},
        "max_tokens": 16,
        "stall_s": 15,
        "watchdog": {
            "probe_interval_s": 0.5,
            "hang_s": 4,
            "window_s": 5,
            "error_rate": 0.9,
            "min_requests": 50,
        },
    }
    proc = _start("run", str(_scenario(tmp_path, soak)), "--results", str(results))
    try:
        run_dir = _wait_for(lambda: _run_dir(results), 60, "the run folder", proc)
        _wait_for(
            lambda: any(e["event"] == "start" for e in _events(run_dir, "soak_slices.jsonl")),
            240,
            "the soak to start",
            proc,
        )
        first = _wait_for(lambda: _soak_engine(proc.pid), 60, "the soak engine", proc)
        _wait_for(
            lambda: (
                list((run_dir / "soak").glob("*.jsonl"))
                and sum(1 for f in (run_dir / "soak").glob("*.jsonl") for _ in read_jsonl(f)) >= 1
            ),
            120,
            "a soak record",
            proc,
        )
        first.send_signal(signal.SIGKILL)
        _wait_for(
            lambda: any(v["kind"] == "crash" for v in _events(run_dir, "verdicts.jsonl")), 60, "the crash verdict", proc
        )
        crashed_at = next(v["t_unix"] for v in _events(run_dir, "verdicts.jsonl") if v["kind"] == "crash")
        _wait_for(
            lambda: any(
                r["status"] == "ok" and r["start_unix_s"] > crashed_at
                for f in (run_dir / "soak").glob("*.jsonl")
                for r in read_jsonl(f)
            ),
            120,
            "a request served by the restarted engine",
            proc,
        )
        second = _soak_engine(proc.pid)
        assert second is not None and second.pid != first.pid
        second.send_signal(signal.SIGSTOP)
        _wait_for(
            lambda: any(v["kind"] == "hang" for v in _events(run_dir, "verdicts.jsonl")), 60, "the hang verdict", proc
        )
        out = _finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 4, out[-4000:]  # the soak failed: a crash and a hang (README, exit codes)
    verdicts = _events(run_dir, "verdicts.jsonl")
    # the two faults planted and nothing else: a restarted engine is not a collapse
    assert sorted({v["kind"] for v in verdicts}) == ["crash", "hang"], verdicts
    crash = next(v for v in verdicts if v["kind"] == "crash")
    hang = next(v for v in verdicts if v["kind"] == "hang")
    assert crash["action"] == "restart" and crash["evidence"]["exit_code"] == -signal.SIGKILL
    assert hang["action"] == "restart" and hang["evidence"]["process_status"] == psutil.STATUS_STOPPED
    assert hang["evidence"]["silent_s"] >= 4
    assert (
        crash["engine_uptime_s"] > 0 and hang["engine_uptime_s"] < crash["engine_uptime_s"] + 60
    )  # the restarted engine is younger
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed_with_failures"
    assert manifest["configurations"]["baseline"]["soak"]["first_failure"]["kind"] == "crash"
    slices = [e for e in _events(run_dir, "soak_slices.jsonl") if e["event"] == "end"]
    assert sum(e["restarts"] for e in slices) == 2
    # every request Locust completed is one record, no more, no fewer
    records = [r for f in (run_dir / "soak").glob("*.jsonl") for r in read_jsonl(f)]
    locust_total = sum(e["locust_stats"]["requests"] for e in slices)
    assert len(records) == locust_total > 0
    assert len({r["id"] for r in records}) == len(records)
    failed = [r for r in records if r["status"] == "error"]
    assert sum(e["locust_stats"]["failures"] for e in slices) == len(failed)
    # in flight when the engine died or froze, or sent while it was down or loading (503)
    assert all(r["error_kind"] in {"connection", "truncated", "stall", "overload"} for r in failed), [
        r["error"] for r in failed
    ]
    assert len(failed) < 100  # users back off while the engine is down: no storm of failures
    assert any(r["status"] == "ok" for r in records)
    assert not psutil.pid_exists(second.pid) or psutil.Process(second.pid).status() == psutil.STATUS_ZOMBIE
    rows[0].done("verdict `crash`, restarted; Locust's count equals the records", runs_completed=1)
    rows[1].done(f"verdict `hang` after {hang['evidence']['silent_s']:.0f} s silent, killed, restarted")


def test_harness_sigkilled_mid_soak_resumes_without_losing_or_duplicating_a_record(
    tmp_path: Path, fault_log: FaultLog
) -> None:
    row = fault_log.inject(
        "harness",
        "SIGKILL of the harness mid-soak",
        "SIGKILL to `specsoak run`, then `specsoak resume`",
        "engine and Locust die with it; resume loses and duplicates no record",
    )
    results = tmp_path / "results"
    soak = {
        "duration_s": 28,  # killed after its second record; the resume runs the rest
        "shape": {"kind": "steady", "users": 2},
        "max_tokens": 12,
        "stall_s": 15,
        "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 5},
    }
    proc = _start("run", str(_scenario(tmp_path, soak)), "--results", str(results))
    try:
        run_dir = _wait_for(lambda: _run_dir(results), 60, "the run folder", proc)
        _wait_for(
            lambda: (
                sum(1 for f in (run_dir / "soak").glob("*.jsonl") for _ in read_jsonl(f)) >= 2
                if (run_dir / "soak").exists()
                else False
            ),
            300,
            "two soak records",
            proc,
        )
        children = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the engine and Locust die with the harness (parent-death signal): nothing is orphaned
    _wait_for(
        lambda: all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children), 30, "children to die"
    )
    before = {r["id"]: r for f in (run_dir / "soak").glob("*.jsonl") for r in read_jsonl(f)}
    measured_before = [r["id"] for r in read_jsonl(run_dir / "requests.jsonl")]
    assert before and json.loads((run_dir / "manifest.json").read_text())["status"] == "running"

    resumed = _start("resume", str(run_dir))
    out = _finish(resumed, 400)
    assert resumed.returncode == 0, out[-4000:]
    after = [r for f in (run_dir / "soak").glob("*.jsonl") for r in read_jsonl(f)]
    ids = [r["id"] for r in after]
    assert len(ids) == len(set(ids)), "a record was duplicated"
    assert set(before) <= set(ids), "a record was lost"
    assert all(before[i] == next(r for r in after if r["id"] == i) for i in before)
    assert len(after) > len(before)
    assert [r["id"] for r in read_jsonl(run_dir / "requests.jsonl")][: len(measured_before)] == measured_before
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and len(manifest["resumes"]) == 1
    assert _events(run_dir, "verdicts.jsonl") == []  # a healthy engine, killed with its harness: no verdict
    assert manifest["resumes"][0]["previous_status"] == "running"
    assert (run_dir / "report.md").exists()
    row.done(
        f"resumed to completion; {len(before)} records before the kill all kept, none duplicated",
        runs_completed=1,
        samples_lost=len(set(before) - set(ids)),
    )


def test_distributed_locust_master_and_two_workers_write_the_same_record_schema(tmp_path: Path) -> None:
    results = tmp_path / "results"
    soak = {
        "duration_s": 20,
        "workers": 2,
        "shape": {"kind": "steady", "users": 2},
        "max_tokens": 8,
        "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 5},
    }
    proc = _start("run", str(_scenario(tmp_path, soak)), "--results", str(results))
    out = _finish(proc, 400)
    assert proc.returncode == 0, out[-4000:]
    run_dir = _run_dir(results)
    assert run_dir is not None
    files = list((run_dir / "soak").glob("*.jsonl"))
    records = [r for f in files for r in read_jsonl(f)]
    assert len(files) == 2, [f.name for f in files]  # one per worker process; the master sends nothing
    assert len({r["id"].split("/")[1] for r in records}) == 2
    schema = set(RequestRecord.__dataclass_fields__)
    assert records and all(set(r) == schema for r in records)
    assert list((run_dir / "logs").glob("locust-*-worker0.log")), sorted(p.name for p in (run_dir / "logs").iterdir())
    slices = [e for e in read_jsonl(run_dir / "soak_slices.jsonl") if e["event"] == "end"]
    # the master's final statistics are a snapshot of what the workers had reported when it quit;
    # requests finishing during the stop timeout reach the records but may miss that snapshot
    assert 0 < sum(e["locust_stats"]["requests"] for e in slices) <= len(records)
    assert list(read_jsonl(run_dir / "verdicts.jsonl")) == []  # a healthy engine: no verdict
    # two users on two slots, a curve measured at one stream: the soak says where its curve is only a lower bound
    start = next(e for e in read_jsonl(run_dir / "soak_slices.jsonl") if e["event"] == "start")
    assert (start["curve_streams"], start["soak_streams"]) == (1, 2), start
    assert "the soak can decode 2 streams at once and the measurement measured 1" in " ".join(out.split()), out[-3000:]
