"""bench/open_loop.py's figures from a fake server's arrival log: achieved rate, send-time error against the ideal
constant schedule, late share (docs/performance.md#open-loop)."""

from __future__ import annotations

import pytest

from bench.measure import ServerLog
from bench.open_loop import send_figures


def _log(arrivals_s: list[float]) -> ServerLog:
    return ServerLog([{"recv_ns": int(t * 1e9), "completed": True} for t in arrivals_s])


def test_a_client_on_schedule_has_no_error_whatever_its_first_connection() -> None:
    on_time = [100.0 + i / 10 for i in range(50)]
    f = send_figures(_log([on_time[0] + 0.05, *on_time[1:]]), 10.0)  # the first one 50 ms late: one arrival, not all
    assert f["achieved_rps"] == pytest.approx(10.0, rel=0.02) and f["send_err_p50_ms"] == pytest.approx(0.0, abs=1e-3)
    assert f["late_share"] == pytest.approx(1 / 50) and f["gap_cv"] < 0.1


def test_a_client_that_falls_behind_shows_late_sends_and_a_lower_rate() -> None:
    # asked 10 rps, sends every 0.12 s: it drifts 20 ms further behind with every request
    f = send_figures(_log([i * 0.12 for i in range(40)]), 10.0)
    assert f["achieved_rps"] == pytest.approx(1 / 0.12, rel=1e-6)
    assert f["late_share"] > 0.4 and f["send_err_p99_ms"] > 300
    assert f["gap_cv"] == pytest.approx(0.0, abs=1e-6)  # regular, but at the wrong rate


def test_bursts_show_in_the_gaps_and_the_error() -> None:
    bursty = [
        t for i in range(10) for t in (i * 0.5, i * 0.5 + 0.001, i * 0.5 + 0.002, i * 0.5 + 0.003, i * 0.5 + 0.004)
    ]  # 10 rps in fives
    f = send_figures(_log(bursty), 10.0)
    assert f["gap_cv"] > 1.5 and f["send_err_p99_ms"] > 150
