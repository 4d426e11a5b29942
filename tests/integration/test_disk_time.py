"""A slow disk is not the engine's throughput: a phase's clocks stop when its last response ends, before
its records are written (issue: total t/s @N once included the fsync of the phase's records)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from harness.records import PHASES, REQUESTS, read_jsonl
from harness.runner import Runner
from harness.scenario import load_scenario
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
FSYNC_DELAY_S = 1.0


def test_a_slow_fsync_stays_out_of_the_phase_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path) -> None:
    data = {"name": "slowdisk", "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "threads": 2, "stop_grace_s": 3},
            "configurations": [{"name": "baseline", "algorithm": "none"}],
            "measurement": {"prompts": "builtin:repeat", "max_tokens": 16, "streams": [1], "requests_per_stream": 3, "repetitions": 1,
                            "warmup_requests": 0}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    real_fsync = os.fsync
    calls: list[float] = []

    def slow_fsync(fd: int) -> None:  # a disk that takes a second to make anything durable
        calls.append(time.time())
        time.sleep(FSYNC_DELAY_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    result = Runner(load_scenario(tmp_path / "s.yaml"), tmp_path / "results").run()
    monkeypatch.setattr(os, "fsync", real_fsync)
    (phase,) = list(read_jsonl(result.run_dir / PHASES))
    records = [r for r in read_jsonl(result.run_dir / REQUESTS) if r["attempt"] == phase["attempt"]]
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    last_end = max(r["start_unix_s"] + r["e2e_s"] for r in records)
    assert calls, "the slow fsync was never called"
    # the phase ended with its last response, not a second later when its records were durable
    assert phase["end_unix_s"] - last_end < 0.2, (phase["end_unix_s"] - last_end)
    assert phase["wall_s"] < last_end - phase["start_unix_s"] + 0.2
    assert phase["total_tps"] == pytest.approx(phase["output_tokens"] / phase["wall_s"])
