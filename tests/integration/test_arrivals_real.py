"""Open-loop arrivals on the real llama-server (issue #17): at a rate it keeps up with, every request goes out on
time and the achieved rate follows the offered one; past its capacity, requests due while every slot is busy are
recorded late with their delay, and the achieved rate and the goodput fall behind the offered rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records import read_jsonl
from tests.integration.conftest import SMOLLM2, run_scenario

pytestmark = pytest.mark.engine


def test_open_loop_phases_on_the_real_engine(tmp_path: Path) -> None:
    data = {
        "name": "arrivals",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        # constant arrivals: 0.5 rps leaves the engine idle between requests; 8 rps of 48-token answers is
        # several times what 2 slots on 2 cores serve (about 1-2 rps here)
        "measurement": {"prompts": "builtin:repeat", "max_tokens": 48, "repetitions": 1, "warmup_requests": 1,
                        "arrival": {"kind": "constant", "rate_rps": [0.5, 8], "requests": 8, "max_in_flight": 2, "seed": 1}},
        "slo": {"ttft_p95_s_max": 1.0},
    }
    run = run_scenario(data, tmp_path, timeout=600)
    phases = {p["load"]: p for p in read_jsonl(run / "phases.jsonl")}
    slow, fast = phases["0.5rps"], phases["8rps"]
    assert slow["requests"] == fast["requests"] == 8 and slow["errors"] == fast["errors"] == 0
    assert slow["offered_rps"] == pytest.approx(0.5, rel=0.05)  # constant spacing: 2 s between sends
    assert slow["late"] == 0 and slow["achieved_rps"] == pytest.approx(slow["offered_rps"], rel=0.25)
    assert slow["goodput_rps"] == pytest.approx(slow["achieved_rps"])  # every request met the SLO
    assert fast["offered_rps"] == pytest.approx(8, rel=0.05)
    assert fast["late"] >= 4 and fast["max_send_delay_s"] > 0.2
    assert fast["achieved_rps"] < 0.6 * fast["offered_rps"]
    assert fast["goodput_rps"] < fast["achieved_rps"]  # late sends count their wait in TTFT: some miss the 1 s SLO
    late = [r for r in read_jsonl(run / "requests.jsonl") if r.get("phase") == "arrivals" and r.get("late")]
    assert len(late) == fast["late"] and all(r["send_delay_s"] > 0 and r["scheduled_unix_s"] for r in late)
