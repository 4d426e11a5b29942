"""Soak building blocks without an engine: shapes, the drift test, tails, durability."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.detect.trend import trend
from harness.load.shapes import load_trace, users_at
from harness.records.files import JsonlWriter, read_jsonl
from harness.soak.slice import soak_elapsed
from harness.soak.tail import RecordTail


def test_steady_ramp_diurnal_bursts() -> None:
    assert users_at({"kind": "steady", "users": 3}, 999, 100) == 3
    ramp = {"kind": "ramp", "start_users": 1, "users": 9}
    assert [users_at(ramp, t, 100) for t in (0, 50, 100, 200)] == [1, 5, 9, 9]
    day = {"kind": "diurnal", "start_users": 1, "users": 5, "period_s": 100}
    assert users_at(day, 0, 100) == 1 and users_at(day, 50, 100) == 5 and users_at(day, 100, 100) == 1
    assert users_at(day, 25, 100) == 3
    bursts = {"kind": "bursts", "users": 1, "peak_users": 6, "period_s": 60, "burst_s": 10}
    assert users_at(bursts, 5, 600) == 1 and users_at(bursts, 55, 600) == 6 and users_at(bursts, 65, 600) == 1


def test_trace_is_sorted_and_errors_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"t_s": 2}\n{"t_s": 0.5, "prompt_id": "qa-tides"}\n')
    assert load_trace(p) == [(0.5, "qa-tides"), (2.0, None)]
    p.write_text('{"t_s": 1}\n{"when": 2}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2:"):
        load_trace(p)


HOUR = 3600.0


def _series(
    seed: int, slope_per_window: float, n: int = 40, level: float = 50.0, noise: float = 2.0
) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 300.0  # 5-minute windows: 40 windows = 3 h 20 min
    y = level + slope_per_window * np.arange(n) + rng.normal(0, noise, n)
    return list(t), list(y)


def test_no_false_alarm_on_noise() -> None:
    alarms = sum(
        bool(tr and tr.drifting)
        for seed in range(200)
        for tr in [trend("decode_tps", *_series(seed, 0.0), bad_direction=-1)]
    )
    assert alarms <= 2  # alpha 0.01, and the minimum effect size makes it rarer still


def test_noise_with_outliers_is_not_drift() -> None:
    t, y = _series(7, 0.0)
    y[5] = 5.0  # a single terrible window (a stall) is not a trend
    y[30] = 90.0
    tr = trend("decode_tps", t, y, bad_direction=-1)
    assert tr is not None and not tr.drifting


def test_planted_decline_is_found_with_its_evidence() -> None:
    t, y = _series(3, -0.25)  # -10 t/s over the soak, 20% of 50
    tr = trend("decode_tps", t, y, bad_direction=-1)
    assert tr is not None and tr.drifting
    assert tr.slope_high_per_hour < 0 and tr.p_value < 0.01 and tr.relative_change < -0.1


def test_rise_in_a_bad_metric_and_rise_in_a_good_one() -> None:
    t, y = _series(4, +0.25)
    assert trend("ttft_p95_s", t, y, bad_direction=+1).drifting  # type: ignore[union-attr]  # enough points: not None
    assert not trend("acceptance", t, y, bad_direction=-1).drifting  # type: ignore[union-attr]  # enough points: not None


def test_small_but_significant_change_is_below_the_effect_size() -> None:
    t, y = _series(5, -0.05, noise=0.2)  # 2 t/s of 50 over the soak: real, but 4%
    tr = trend("decode_tps", t, y, bad_direction=-1)
    assert tr is not None and tr.p_value < 0.01 and not tr.drifting


def test_record_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    tail = RecordTail()
    p.write_text('{"i": 1}\n{"i": 2')
    assert [r["i"] for r in tail.read([p])] == [1]
    with open(p, "a") as f:
        f.write('}\n{"i": 3}\n')
    assert [r["i"] for r in tail.read([p])] == [2, 3]
    assert tail.read([p]) == []


def test_writer_cuts_a_torn_tail_before_appending(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a"}\n{"id": "b", "trunc')
    with JsonlWriter(p) as w:
        w.write({"id": "c"})
    assert [r["id"] for r in read_jsonl(p)] == ["a", "c"]


def test_soak_elapsed_counts_ended_slices_and_the_recorded_part_of_a_cut_one(tmp_path: Path) -> None:
    (tmp_path / "soak").mkdir()
    events = [
        {"event": "start", "slice": "a-s001", "config": "a", "t_unix": 1000.0},
        {"event": "end", "slice": "a-s001", "config": "a", "t_unix": 1030.0, "elapsed_s": 25.0},
        {"event": "start", "slice": "a-s002", "config": "a", "t_unix": 2000.0},
    ]
    (tmp_path / "soak_slices.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "soak" / "a-s002-1.jsonl").write_text(json.dumps({"start_unix_s": 2005.0, "e2e_s": 3.0}) + "\n")
    elapsed, n = soak_elapsed(tmp_path)
    assert n == 2 and elapsed["a"] == pytest.approx(25.0 + 8.0)
