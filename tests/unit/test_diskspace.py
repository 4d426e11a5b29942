"""The run folder's size estimate and the soak's disk watch (harness/soak/disk.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.config.policy import verdict_fails
from harness.config.schema import Scenario, Watchdog
from harness.soak.disk import MIB, DiskWatch, disk_warnings, folder_estimate, record_bytes

RUN_QUICK = Path(__file__).parents[1] / "fixtures" / "run_quick"


def scenario(**soak: Any) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "night",
            "server": {"model": "m.gguf"},
            "configurations": [
                {"name": "baseline", "algorithm": "none"},
                {"name": "ngram", "algorithm": "ngram-map-k"},
            ],
            "measurement": {"streams": [1, 4], "requests_per_stream": 2, "repetitions": 3, "max_tokens": 128},
            **({"soak": {"duration_s": 12 * 3600, **soak}} if soak else {}),
        }
    )


def test_a_record_is_as_large_as_the_real_ones() -> None:
    lines = (RUN_QUICK / "requests.jsonl").read_bytes().splitlines(keepends=True)
    tokens = [json.loads(ln)["output_tokens"] for ln in lines]
    measured = sum(map(len, lines)) / len(lines)
    assert abs(record_bytes(round(sum(tokens) / len(tokens))) - measured) / measured < 0.1


def test_a_night_of_open_loop_arrivals() -> None:
    sc = scenario(arrival={"rate_rps": 0.5}, watchdog={"window_s": 60})
    est = folder_estimate(sc)
    phases = 2 * (1 + 3 * 2 * 5)  # per configuration: warm-up, 3 repetitions of 2 + 8 requests
    assert est.requests == phases + 2 * (0.5 * 12 * 3600 + 3 * 2 * 5)
    assert est.windows_bytes == 2 * 720 * 2000
    assert est.engine_logs == 2 * 3 + 2  # an engine per configuration and block (interleaved), one per soak
    assert (
        est.engine_logs_bytes == 6 * 11 * 100_000 + 2 * 256 * MIB
    )  # llama-server's ~100 KB a request; a night's soak reaches the bound


def test_validate_warns_when_the_results_disk_is_too_small(tmp_path: Path, monkeypatch: Any) -> None:
    sc = scenario(arrival={"rate_rps": 0.5})
    monkeypatch.setattr("harness.soak.disk.free_bytes", lambda _p: 500 * MIB)
    [warning] = disk_warnings(sc, tmp_path)
    assert "500 MiB free" in warning and "'disk' verdict" in warning
    monkeypatch.setattr("harness.soak.disk.free_bytes", lambda _p: 100_000 * MIB)
    assert disk_warnings(sc, tmp_path) == []


def test_the_watch_stops_before_the_disk_is_full(tmp_path: Path) -> None:
    free = iter([5000 * MIB, 4900 * MIB, 3000 * MIB, 2900 * MIB])
    watch = DiskWatch(tmp_path, Watchdog(window_s=60, disk_min_free_mib=1024), free=lambda: next(free))
    assert watch.check(0.0) is None  # no rate yet, plenty free
    assert watch.check(60.0) is None  # 100 MiB a window: 39 windows left
    message, evidence = watch.check(120.0)  # type: ignore[misc]  # this check fires: not None
    assert (
        "fills at" in message and evidence["free_mib"] == 3000
    )  # 1900 MiB a window: under the floor within two windows
    assert watch.check(180.0) is None  # said once


def test_the_watch_below_its_floor_and_the_default_action() -> None:
    watch = DiskWatch(Path("/"), Watchdog(disk_min_free_mib=1024), free=lambda: 1000 * MIB)
    message, _ = watch.check(0.0)  # type: ignore[misc]  # this check fires: not None
    assert "below soak.watchdog.disk_min_free_mib" in message
    wd = Watchdog()
    assert wd.action("disk") == "stop_run" and verdict_fails({"kind": "disk", "action": "stop_run"})
    assert not verdict_fails({"kind": "disk", "action": "record"})
