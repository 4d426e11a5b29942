"""An open-loop soak (soak.arrival) on the real llama-server with real Locust (issue #17): each request goes out at
its scheduled time, the windows say what was asked, offered and achieved, a request that could not go out on time
(one in flight at most, a rate past what one slot serves) is counted late with its delay, goodput per window is the
count of requests that met the SLO, the exporter serves the new gauges, and the open-loop phase runs again after
the soak."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.common.net import free_port
from harness.load.schedule import LATE_AFTER_S, soak_offsets
from harness.records.columnar import soak_requests_frame
from harness.records.files import AFTER_SOAK, PHASES, SOAK_DIR, VERDICTS, WINDOWS, read_jsonl
from tests.faults.helpers import finish, start_cli
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

# Poisson arrivals in two stages: 0.2 rps, which one slot serves on time, then 5 rps, several times what one slot
# serves (a 16-token answer takes 0.5-3 s on 2 shared cores): the queue grows and requests go out late
STAGES = [{"rate_rps": 0.2, "duration_s": 20.0}, {"rate_rps": 5.0, "duration_s": 20.0}]
SOAK_S = 40.0
E2E_MAX_S = 5.0  # from the scheduled time: met in the first stage, missed by the requests that waited in the second
ARRIVAL = {"kind": "poisson", "stages": STAGES, "max_in_flight": 1, "seed": 7}


def _scenario(folder: Path) -> Path:
    data = {
        "name": "open-soak",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        # one short open-loop phase, so the bracket after the soak has one to run again
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 8,
            "repetitions": 1,
            "warmup_requests": 0,
            "arrival": {"kind": "constant", "rate_rps": 1, "requests": 3, "max_in_flight": 2},
        },
        "slo": {"e2e_s_max": E2E_MAX_S},
        "soak": {
            "duration_s": SOAK_S,
            "arrival": ARRIVAL,
            "prompts": "builtin:repeat",
            "max_tokens": 16,
            "stall_s": 20,
            "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 10},
            "after_repetitions": 2,  # the bracket twice, each time with the one repetition's schedule and prompts
        },
    }
    path = folder / "open-soak.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def _gauge(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]


def test_open_loop_soak_on_the_real_engine(tmp_path: Path) -> None:
    port = free_port()
    proc = start_cli(
        "run",
        str(_scenario(tmp_path)),
        "--results",
        str(tmp_path / "results"),
        "--metrics-port",
        str(port),
        "--metrics-linger",
        "2",
    )
    seen: str | None = None
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:
            text = _scrape(port)
            if (
                text
                and _gauge(text, "specsoak_soak_goodput_requests_per_second")
                and _gauge(text, "specsoak_soak_offered_requests_per_second")
            ):
                seen = text
                break
            time.sleep(1)
        out = finish(proc, 400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    run = next((tmp_path / "results").glob("*-open-soak"))
    windows = list(read_jsonl(run / WINDOWS))
    records = [r for f in sorted((run / SOAK_DIR).glob("*.jsonl")) for r in read_jsonl(f)]
    assert len(windows) >= 3 and records

    # every request went out at its scheduled time (or is late): the records' schedule is the drawn one
    starts = [json.loads(f.read_text()) for f in (run / SOAK_DIR).glob("*.pacing.json")]
    assert len(starts) == 1
    t0 = starts[0]["t0_unix"]
    drawn = soak_offsets(ARRIVAL, 0.0, SOAK_S, SOAK_S)
    sched = np.sort([r["scheduled_unix_s"] - t0 for r in records])
    assert len(sched) <= len(drawn)
    assert np.allclose(sched, drawn[: len(sched)], atol=1e-3)
    on_time = [r for r in records if not r["late"]]
    assert on_time and all(r["send_delay_s"] <= LATE_AFTER_S for r in on_time)

    # offered ≈ asked: every scheduled arrival falls in one window; where a window holds enough of them, their rate is
    # the asked one within Poisson noise; the window across the stage change has no load level (the detector skips it)
    assert sum(w["scheduled"] for w in windows) == len(drawn) == starts[0]["scheduled"]
    assert len(drawn) / SOAK_S == pytest.approx((0.2 * 20 + 5.0 * 20) / SOAK_S, rel=0.3)
    busy = [w for w in windows if w["asked_rps"] and w["asked_rps"] * (w["soak_t_end_s"] - w["soak_t_start_s"]) >= 30]
    assert busy and all(w["offered_rps"] == pytest.approx(w["asked_rps"], rel=0.4) for w in busy)
    assert any(w["asked_rps"] is not None and w["load_level"] is None for w in windows)
    assert all(w["asked_rps"] is None for w in windows if w["soak_t_start_s"] >= SOAK_S)

    # overloaded (one in flight, arrivals faster than one slot serves): late sends, counted with their delay
    late = [r for r in records if r["late"]]
    assert len(late) >= 10 and all(r["send_delay_s"] > 0 for r in late)
    assert sum(w["late"] for w in windows) == len(late)
    assert all(w["achieved_rps"] < 0.8 * w["offered_rps"] for w in busy)
    # a healthy engine offered more than it serves: at most an `overload` finding (recorded), never a collapse
    assert {v["kind"] for v in read_jsonl(run / VERDICTS)} <= {"overload"}, list(read_jsonl(run / VERDICTS))

    # goodput: per window, the requests that met the SLO (end-to-end from the scheduled time) over its seconds
    def met(r: dict) -> bool:
        return r["status"] == "ok" and r["e2e_s"] + r["send_delay_s"] <= E2E_MAX_S

    assert sum(w["slo_met"] for w in windows) == sum(1 for r in records if met(r))
    assert 0 < sum(w["slo_met"] for w in windows) < len(records)
    for w in windows:
        assert w["goodput_rps"] == pytest.approx(w["slo_met"] / (w["t_end_unix"] - w["t_start_unix"]))
        assert w["users"] is None and "load_level" in w

    # the exporter served the window's figures while the soak ran
    assert seen is not None, "the exporter never served the soak's goodput and offered-rate gauges"
    assert _gauge(seen, "specsoak_soak_late_requests") and _gauge(seen, "specsoak_soak_achieved_requests_per_second")

    # the Parquet twin of the soak records keeps the open-loop fields
    frame = soak_requests_frame(run / SOAK_DIR, ["late", "scheduled_unix_s", "start_unix_s", "id"])
    assert int(frame["late"].sum()) == len(late) and frame["scheduled_unix_s"].notna().all()

    # the bracket after the soak ran the open-loop phase again, on the same schedule
    before = [p for p in read_jsonl(run / PHASES) if p.get("load") == "1rps"]
    after = [p for p in read_jsonl(run / AFTER_SOAK) if p.get("load") == "1rps"]
    assert len(before) == 1 and [p["repetition"] for p in after] == [1, 2]  # soak.after_repetitions
    assert all(p["scheduled"] == before[0]["scheduled"] == 3 and p["phase"] == "after_soak" for p in after)
    answered = list(read_jsonl(run / "requests.jsonl"))
    prompts = lambda phase, rep: sorted(
        r["prompt_id"] for r in answered if r["phase"] == phase and r["repetition"] == rep
    )
    assert prompts("after_soak", 1) == prompts("after_soak", 2) == prompts("arrivals", 1) != []
    report = (run / "report.md").read_text()
    assert "achieved rps before" in report and "1rps" in report  # the report's before/after table has the open-loop row
