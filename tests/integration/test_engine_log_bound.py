"""The engine log's bound on the real llama-server: a soak of distinct prompts with its prompt cache on (the default,
which lists every cached prompt on every request) keeps the log under report.engine_log_max_mib (docs/soak.md#engine-logs)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engines.logcapture import LogBound, LogIndex
from harness.records.files import read_jsonl
from tests.faults.helpers import finish, start_cli, wait_for
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
BOUND_MIB = 0.0625  # the smallest bound: 64 KiB, of which the start-up section takes ~15 KB
LOG = "logs/baseline.soak.server.log"


def _on_disk(run: Path) -> int:
    total = 0
    for p in (run / "logs").glob("baseline.soak.server.log*"):
        if not p.name.endswith((".json", ".json.tmp")):
            with contextlib.suppress(FileNotFoundError):  # a rotation renamed or dropped it meanwhile
                total += p.stat().st_size
    return total


def test_a_soak_keeps_the_engine_log_under_its_bound_and_the_report_names_what_was_dropped(tmp_path: Path) -> None:
    data = {
        "name": "log-bound",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        # distinct short prompts (windows of the corpus, 24 tokens each): many requests, each one more prompt in the cache's listing
        "soak": {
            # 60 s: the engine wrote 0.70 MiB here, 5.6x what the test needs (twice the bound); 150 s wrote 3.65 MiB.
            # The listing grows with every request, so the bytes grow faster than the time: 40 s is enough
            "duration_s": 40,
            "shape": {"kind": "steady", "users": 2},
            "max_tokens": 4,
            "prompt_reuse": "forbid",
            "prompts": "builtin:conversations",
            "lengths": {"input": {"dist": "fixed", "mean": 24}, "prompts": 2000},
            "watchdog": {"window_s": 10},
        },
        "report": {"engine_log_max_mib": BOUND_MIB},
    }
    path = tmp_path / "log-bound.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    proc = start_cli("run", str(path), "--results", str(results))
    sizes: list[int] = []
    try:
        run = wait_for(
            lambda: next(results.glob("*-log-bound"), None) if results.exists() else None, 60, "the run folder", proc
        )
        wait_for((run / LOG).exists, 240, "the soak's engine log", proc)
        while proc.poll() is None:
            sizes.append(_on_disk(run))
            time.sleep(0.2)
        out = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    bound = LogBound.of_mib(BOUND_MIB)
    assert max(sizes) <= bound.max_bytes + bound.segment_bytes, (
        f"{max(sizes)} bytes on disk while the soak ran, bound {bound.max_bytes}"
    )
    assert _on_disk(run) <= bound.max_bytes
    assert list(read_jsonl(run / "verdicts.jsonl")) == []  # a healthy engine, its log rotated: no verdict

    idx = LogIndex.read(run / LOG)
    assert idx is not None and idx.dropped_bytes > 0 and idx.written_bytes > 2 * bound.max_bytes, idx
    startup = (run / LOG).read_bytes()[: idx.startup_bytes].decode()
    assert (
        startup.startswith("# [")
        and startup.endswith("\n")
        and "llama_server: listening on" in startup.splitlines()[-1]
    )
    assert "llama_server: model loaded" in startup and "llama_context:" in startup  # the capacity lines, whole
    requests = sum(1 for f in (run / "soak").glob("*.jsonl") for _ in read_jsonl(f))
    print(
        f"soak: {requests} requests, engine wrote {idx.written_bytes / 2**20:.2f} MiB ({idx.written_bytes / max(requests, 1) / 1024:.1f} KiB "
        f"a request), kept {_on_disk(run) / 2**20:.3f} MiB, dropped {idx.dropped_bytes / 2**20:.2f} MiB in {idx.dropped_segments} segments"
    )

    inspected = subprocess.run(
        [sys.executable, "-m", "harness.cli", "inspect-log", "--engine", "llamacpp", "--json", str(run / LOG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert inspected.returncode == 0, inspected.stderr
    cap = json.loads(inspected.stdout)
    assert cap["slots"] == 2 and cap["ctx_per_slot"] == 1024

    m = json.loads((run / "manifest.json").read_text())
    [entry] = [e for e in m["engine_logs"] if e["log"] == LOG]
    assert entry["dropped_bytes"] == idx.dropped_bytes

    rep = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = (run / "report.md").read_text()
    assert f"MiB dropped from {LOG}" in md, [ln for ln in md.splitlines() if "Engine log" in ln]
