"""The collapse detector (harness/detect/changepoint.py) on simulated windows: fast on steps, silent on noise and load changes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.detect.changepoint import (
    WATCHED_CHANGES,
    ChangeDetector,
    ChangeEvent,
    DetectorSettings,
    MetricRule,
    detect_series,
    memory_forecast,
)

WINDOW_S = 60.0
T0 = 1_700_000_000.0
BASE: dict[str, float] = {
    "output_tps": 100.0,
    "decode_tps": 40.0,
    "ttft_p95_s": 0.8,
    "acceptance": 0.7,
    "engine_memory_mib": 2000.0,
}


def _windows(
    n: int,
    seed: int,
    start: int = 0,
    scale: dict[str, float] | None = None,
    users: int | None = 1,
    noise: float = 0.03,
    **fixed: Any,
) -> list[dict[str, Any]]:
    """n windows of every watched metric with multiplicative Gaussian noise; `scale` multiplies a metric's base,
    `fixed` sets a field outright (None: no value)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(start, start + n):
        w: dict[str, Any] = {"t_unix": T0 + (i + 0.5) * WINDOW_S, "users": users, "contaminated": False}
        for m, v in BASE.items():
            w[m] = v * (scale or {}).get(m, 1.0) * (1 + noise * rng.standard_normal())
        w["error_ratio"] = rng.binomial(100, 0.01) / 100
        w.update(fixed)
        out.append(w)
    return out


def _collapses(events: list[ChangeEvent], metric: str | None = None) -> list[ChangeEvent]:
    return [e for e in events if e.kind == "collapse" and (metric is None or e.metric == metric)]


@pytest.mark.parametrize("seed", range(8))
def test_a_30_percent_step_after_hours_flat_is_flagged_within_3_windows(seed: int) -> None:
    flat, onset = 360, 360  # six hours of one-minute windows
    wins = _windows(flat, seed) + _windows(30, seed + 100, start=onset, scale={"output_tps": 0.7})
    events = detect_series(wins)
    got = _collapses(events)
    assert [e.metric for e in got] == ["output_tps"], got
    e = got[0]
    assert e.onset_unix == wins[onset]["t_unix"]
    assert e.t_unix - e.onset_unix <= 2 * WINDOW_S  # decided by the 2nd or 3rd window of the step
    assert e.relative_change == pytest.approx(-0.3, abs=0.08)
    assert e.reference == pytest.approx(100.0, rel=0.05) and e.level == 1 and e.score >= 5.0


def test_collapse_to_zero_with_no_finished_request_is_caught_through_output_tps() -> None:
    dead = [
        {**w, "output_tps": 0.0, "decode_tps": None, "ttft_p95_s": None, "acceptance": None, "error_ratio": None}
        for w in _windows(5, 9, start=100)
    ]
    events = detect_series(_windows(100, 8) + dead)
    got = _collapses(events)
    assert [e.metric for e in got] == ["output_tps"]
    assert got[0].onset_unix == dead[0]["t_unix"] and got[0].relative_change == pytest.approx(-1.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_flat_noise_gives_no_event_over_thousands_of_windows(seed: int) -> None:
    assert detect_series(_windows(5000, seed)) == []


def test_a_load_level_change_is_not_a_collapse_but_a_drop_at_a_level_seen_before_is() -> None:
    det = ChangeDetector()
    events: list[ChangeEvent] = []
    for w in _windows(60, 1, users=1):
        events += det.update(w)
    # users 1 -> 4: throughput per window doubles, per-request decode falls with the load (4^-0.3 = -34%)
    det.update({"t_unix": T0 + 60.5 * WINDOW_S, "users": None, "output_tps": 150.0, "decode_tps": 33.0})
    assert det.judged() == (False, "load level changed")
    four = _windows(60, 2, start=61, users=4, scale={"output_tps": 2.0, "decode_tps": 4**-0.3, "ttft_p95_s": 1.6})
    for i, w in enumerate(four):
        events += det.update(w)
        if i < 5:
            assert det.judged() == (False, "building reference")
    assert det.judged() == (True, None)
    assert det.state()["output_tps"].reference == pytest.approx(200.0, rel=0.05)
    # back at 1 user (its reference is kept), the same per-window throughput as at 4 users would be fine there...
    for w in _windows(20, 3, start=121, users=1):
        events += det.update(w)
    assert events == []
    # ...but a -40% drop at 1 user is a collapse, judged against the 1-user reference
    for w in _windows(5, 4, start=141, users=1, scale={"output_tps": 0.6}):
        events += det.update(w)
    got = _collapses(events)
    assert [(e.metric, e.level) for e in got] == [("output_tps", 1)]
    assert got[0].reference == pytest.approx(100.0, rel=0.05)


def test_contaminated_and_warm_up_windows_are_not_judged() -> None:
    det = ChangeDetector()
    assert det.judged() == (False, "no window yet")
    for i, w in enumerate(_windows(10, 5)):
        det.update(w)
        if i < 2:
            assert det.judged() == (False, "warm-up")
        elif i < 7:
            assert det.judged() == (False, "building reference")
    assert det.judged() == (True, None)
    events: list[ChangeEvent] = []
    # a stolen CPU halves throughput for five windows: contaminated, so nothing
    for w in _windows(5, 6, start=10, scale={"output_tps": 0.5}, contaminated=True):
        events += det.update(w)
        assert det.judged() == (False, "contaminated")
        assert det.state()["output_tps"].relative_change is None
    # an engine restart: two warm-up windows, slow as a cold engine is, are not judged
    det.engine_restarted()
    for w in _windows(2, 7, start=15, scale={"output_tps": 0.5, "engine_memory_mib": 0.5}):
        events += det.update(w)
        assert det.judged() == (False, "warm-up")
    for w in _windows(10, 8, start=17):
        events += det.update(w)
        assert det.judged() == (True, None)
    assert events == []
    st = det.state()["output_tps"]
    assert st.reference == pytest.approx(100.0, rel=0.05) and not st.in_episode and st.relative_change is not None


def test_an_episode_recovers_and_a_later_collapse_alarms_again() -> None:
    wins = (
        _windows(60, 10)
        + _windows(10, 11, start=60, scale={"decode_tps": 0.5})
        + _windows(30, 12, start=70)
        + _windows(10, 13, start=100, scale={"decode_tps": 0.4})
        + _windows(5, 14, start=110)
    )
    events = [e for e in detect_series(wins) if e.metric == "decode_tps"]
    assert [e.kind for e in events] == ["collapse", "recovered", "collapse", "recovered"]
    first, rec = events[0], events[1]
    assert first.onset_unix == wins[60]["t_unix"] and first.t_unix == wins[61]["t_unix"]
    assert rec.episode_start_unix == wins[60]["t_unix"] and rec.episode_end_unix == wins[70]["t_unix"]
    assert rec.t_unix == wins[71]["t_unix"] and rec.size == pytest.approx(-0.5, abs=0.1)
    assert events[2].onset_unix == wins[100]["t_unix"]
    assert events[3].size == pytest.approx(-0.6, abs=0.1)
    assert all(e.to_dict()["metric"] == "decode_tps" for e in events)


def test_no_new_collapse_while_in_an_episode_and_state_says_so() -> None:
    det = ChangeDetector()
    for w in _windows(10, 15):  # 2 warm-up, 5 for the reference, 3 more that refine it
        det.update(w)
    # forty windows of collapse: no second alarm, and they never join the reference (which refines up to 30
    # windows), else the reference would sink to the collapse and the episode would "recover"
    events = [e for w in _windows(40, 16, start=10, scale={"output_tps": 0.3}) for e in det.update(w)]
    assert [e.kind for e in events] == ["collapse"]
    st = det.state()["output_tps"]
    assert st.in_episode and st.score > 5.0 and st.relative_change == pytest.approx(-0.7, abs=0.05)
    assert st.reference == pytest.approx(100.0, rel=0.05)


def test_no_reference_is_built_from_a_collapse() -> None:
    # collapsed at 2 users, then the load moves to 3 users (never seen): those windows must not become
    # the 3-user reference, or the episode would "recover" against a reference of the collapse
    wins = _windows(30, 22, users=2) + _windows(5, 23, start=30, users=2, scale={"output_tps": 0.3})
    wins += _windows(20, 24, start=35, users=3, scale={"output_tps": 0.3})
    det = ChangeDetector()
    events = [e for w in wins for e in det.update(w)]
    assert [(e.kind, e.metric) for e in events] == [("collapse", "output_tps")]
    assert det.state()["output_tps"].in_episode
    assert det.judged() == (True, None)  # the other metrics built the 3-user reference and are judged


def test_rss_warm_up_growth_then_flat_is_not_a_collapse() -> None:
    wins = _windows(600, 17, noise=0.01)
    for i, w in enumerate(wins):  # +15% over the first 10 minutes, then flat
        w["engine_memory_mib"] = 2000.0 * (1 + 0.15 * min(i, 10) / 10) * (1 + 0.01 * np.sin(i))
    assert detect_series(wins) == []
    # a leak that carries RSS +50% above it is
    for i, w in enumerate(wins[300:]):
        w["engine_memory_mib"] = 2300.0 * (1 + 0.5 * min(i, 60) / 60)
    got = _collapses(detect_series(wins))
    assert [e.metric for e in got] == ["engine_memory_mib"]


def test_memory_forecast_slope_and_headroom() -> None:
    rng = np.random.default_rng(18)
    t = [T0 + 60.0 * i for i in range(31)]  # the last 30 minutes
    rss = [3000.0 + 120.0 * (ti - T0) / 3600 + rng.normal(0, 2.0) for ti in t]
    rss[7] += 500.0  # one spike moves a least-squares fit, not the median of pairwise slopes
    f = memory_forecast(t, rss, available_mib=600.0)
    assert f is not None and f.n == 31
    assert f.slope_mib_per_h == pytest.approx(120.0, rel=0.05)
    assert f.headroom_s == pytest.approx(600.0 / 120.0 * 3600, rel=0.05)
    flat = memory_forecast(t, [3000.0] * 31, available_mib=600.0)
    assert flat is not None and flat.slope_mib_per_h == 0.0 and flat.headroom_s is None
    shrinking = memory_forecast(t, [3000.0 - i for i in range(31)], available_mib=600.0)
    assert shrinking is not None and shrinking.headroom_s is None
    assert memory_forecast(t[:2], rss[:2], 600.0) is None  # fewer than 3 points
    assert memory_forecast(t[:6], rss[:6], 600.0) is None  # a 5-minute span
    assert memory_forecast([T0, T0 + 400, T0 + 800, float("nan")], [1.0, 2.0, float("nan"), 4.0], 600.0) is None


def test_error_ratio_from_zero_to_half_alarms_on_an_absolute_scale() -> None:
    wins = _windows(30, 19, error_ratio=0.0) + _windows(5, 20, start=30, error_ratio=0.5)
    got = _collapses(detect_series(wins))
    assert [e.metric for e in got] == ["error_ratio"]
    assert got[0].reference == 0.0 and got[0].relative_change == pytest.approx(0.5)
    assert WATCHED_CHANGES["error_ratio"].absolute


def test_detect_series_restarts_and_refuses_mixed_configurations() -> None:
    wins = _windows(40, 21)
    for w in wins[20:22]:  # a crash: the restart window and the next are cold, and would alarm if judged
        w["output_tps"] = 10.0
    wins[20]["engine_restart"] = True
    assert detect_series(wins) == []
    del wins[20]["engine_restart"]
    assert [e.metric for e in _collapses(detect_series(wins))] == ["output_tps"]
    # older windows.jsonl without the key: a new slice (a new engine) or the CPU meter's restart flag
    assert detect_series([{**w, "slice": "s1" if i < 20 else "s2"} for i, w in enumerate(wins)]) == []
    assert detect_series([{**w, "cpu": {"engine_restarted": i == 20}} for i, w in enumerate(wins)]) == []
    # when the soak recorded engine_restart, it is the word (the live detector saw exactly that)
    assert _collapses(
        detect_series([{**w, "engine_restart": False, "slice": "s1" if i < 20 else "s2"} for i, w in enumerate(wins)])
    )
    with pytest.raises(ValueError, match="one configuration"):
        detect_series([{**wins[0], "config": "a"}, {**wins[1], "config": "b"}])


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="confirm_windows"):
        DetectorSettings(confirm_windows=0)
    with pytest.raises(ValueError, match="refine_windows must be >= reference_windows"):
        DetectorSettings(reference_windows=10, refine_windows=5)
    assert DetectorSettings().threshold == 5.0


def test_a_collapse_right_after_a_short_reference_does_not_become_the_reference() -> None:
    """The real planted soak on a busy machine: three reference windows (one low), then nothing streams; the zero
    windows must not refine the reference down until they look normal."""
    st = DetectorSettings(warmup_windows=1, reference_windows=3, confirm_windows=2)
    values = [7.9, 12.3, 11.5, 4.7, 7.0] + [0.0] * 8
    wins = [
        {"t_unix": T0 + 8.0 * i, "users": 1, "output_tps": v, "count_sd": {"output_tps": v * 0.5 / 3 if v else None}}
        for i, v in enumerate(values)
    ]
    got = [e for e in detect_series(wins, st) if e.kind == "collapse"]
    assert [e.metric for e in got] == ["output_tps"] and got[0].t_unix <= wins[6]["t_unix"]


def test_open_loop_windows_judge_the_decode_of_requests_alone_at_one_reference_for_every_level() -> None:
    """Open loop, per-request decode t/s follows how many requests shared the engine (25-77 t/s at one level of the
    two-hour soak): it is not judged; the decode of the requests that ran alone is, against one reference whatever
    the level, since the load does not move it."""
    det = ChangeDetector(DetectorSettings(warmup_windows=0, reference_windows=3))
    events: list[ChangeEvent] = []
    for i in range(12):
        level = -20 if i < 6 else -15  # a heavier level that never gets a reference of its own for the others
        w = {
            "t_unix": T0 + i * WINDOW_S,
            "load_level": level,
            "load_settled": i < 6,
            "decode_tps": 70.0 if i % 2 else 25.0,  # by chance alone, or sharing the engine with three others
            "alone_decode_tps": 70.0 if i < 9 else 30.0,  # the engine's own speed halves at window 9
        }
        events += det.update(w)
    assert [(e.metric, e.level, e.t_unix) for e in _collapses(events)] == [
        ("alone_decode_tps", None, T0 + 10 * WINDOW_S)
    ]
    closed = ChangeDetector(DetectorSettings(warmup_windows=0, reference_windows=3))
    for i in range(8):  # closed loop: per-request decode is judged, the alone figure is not
        closed.update(
            {"t_unix": T0 + i * WINDOW_S, "users": 1, "decode_tps": 40.0 if i < 5 else 10.0, "alone_decode_tps": 5.0}
        )
    assert closed.state()["decode_tps"].in_episode and closed.state()["alone_decode_tps"].reference is None
    with pytest.raises(ValueError, match="loop"):
        MetricRule(bad_direction=-1, min_change=0.4, noise_floor=0.02, loop="both")


# CI's gauntlet soak, 2026-12-03 (the test's console, windows ending 101-161 s): one user, 10-s windows, output t/s and
# finished requests; the 8-s SIGSTOP fell in the window ending 151 s, after a window the canary's requests had slowed
GAUNTLET_CI = [(13.3, 4), (12.7, 4), (14.6, 5), (14.6, 5), (9.5, 3), (1.7, 1), (9.1, 3)]


def _gauntlet_windows(paused: dict[int, float]) -> list[dict[str, Any]]:
    return [
        {
            "t_unix": T0 + 10.0 * i,
            "users": 1,
            "output_tps": tps,
            "count_sd": {"output_tps": tps * 0.5 / n},
            "paused_s": paused.get(i, 0.0),
        }
        for i, (tps, n) in enumerate([(12.0, 4), *GAUNTLET_CI])  # the first window is the warm-up
    ]


def test_a_pause_is_the_stall_verdicts_and_confirms_no_collapse_wherever_it_falls() -> None:
    st = DetectorSettings(warmup_windows=1, reference_windows=3, confirm_windows=2)
    # as CI judged it (no window knew of the pause): the pause's window and a slow one before it were a collapse
    assert [e.metric for e in detect_series(_gauntlet_windows({}), st) if e.kind == "collapse"] == ["output_tps"]
    # the pause's window is excused: the slow windows either side of it are a score of about 2 sigmas, not 5
    assert not [e for e in detect_series(_gauntlet_windows({6: 7.8}), st) if e.kind == "collapse"]
    # a 10-s pause straddling two windows, 5 s in each: both fall by half, neither confirms (unexcused, they would)
    base = [
        {"t_unix": T0 + 10.0 * i, "users": 1, "output_tps": 13.0, "count_sd": {"output_tps": 1.6}} for i in range(6)
    ]
    straddle = [{**base[0], "t_unix": T0 + 10.0 * (6 + j), "output_tps": 6.5, "paused_s": 5.0} for j in range(2)]
    after = [{**base[0], "t_unix": T0 + 10.0 * (8 + j)} for j in range(4)]
    assert not [e for e in detect_series([*base, *straddle, *after], st) if e.kind == "collapse"]
    unpaused = [{**w, "paused_s": 0.0} for w in straddle]
    assert [e.kind for e in detect_series([*base, *unpaused, *after], st)] == ["collapse", "recovered"]
    # an engine that keeps pausing, window after window, has collapsed: past pause_windows they are judged
    keeps = [{**straddle[0], "t_unix": T0 + 10.0 * (6 + j)} for j in range(6)]
    got = [e for e in detect_series([*base, *keeps], st) if e.kind == "collapse"]
    assert [e.t_unix for e in got] == [keeps[st.pause_windows + st.confirm_windows - 1]["t_unix"]]
    with pytest.raises(ValueError, match="pause_windows"):
        DetectorSettings(pause_windows=-1)


def _indexed(values: list[float], prior: float | None = 1.0) -> list[dict[str, Any]]:
    """Open-loop windows holding only a speed index (per-request sd 0.05) and its prior, the level changing in every
    other one."""
    return [
        {
            "t_unix": T0 + (i + 0.5) * WINDOW_S,
            "load_level": None if i % 2 else 1,
            "load_settled": False,
            "speed_index": v,
            "speed_index_prior": prior,
            "count_sd": {"speed_index": 0.05},
        }
        for i, v in enumerate(values)
    ]


SPEED = {"speed_index": WATCHED_CHANGES["speed_index"]}


def test_the_speed_index_is_judged_against_its_prior_from_the_first_window_after_warm_up() -> None:
    """Issue #33: a 30-minute soak of one-minute windows spent five of them building the index's reference, so it could
    not reach 90% judged. The index is 1 on an engine at its curve, so a window that carries that prior is judged
    against it from the first one after warm-up, whatever its load does, and the level's own reference follows from
    its first ``reference_windows`` windows not past min_change."""
    st = DetectorSettings(warmup_windows=2, reference_windows=5, confirm_windows=2)
    det = ChangeDetector(st, rules=SPEED)
    judged, refs = [], []
    for w in _indexed([1.0, 1.0, 1.1, 0.9, 1.2, 1.15, 1.05, 1.1, 1.0]):
        assert det.update(w) == []
        judged.append(det.judged()[0])
        refs.append(det.state()["speed_index"].reference)
    assert judged == [False, False] + [True] * 7
    # judged against 1 until five windows are in, then against their median
    assert refs[2:6] == [1.0] * 4 and refs[6] == pytest.approx(1.1) and refs[8] == pytest.approx(1.1)
    # an engine at half its curve from the first window after warm-up: a collapse by the second judged window, which
    # says it was judged against the prior
    slow = detect_series(_indexed([1.0, 1.0] + [0.5] * 4), st, rules=SPEED)
    assert [(e.kind, e.onset_unix, e.prior) for e in slow] == [("collapse", T0 + 2.5 * WINDOW_S, True)]
    assert slow[0].t_unix == T0 + 3.5 * WINDOW_S and slow[0].reference == 1.0
    # the slowed windows never became the reference: a later window at 1 is back, and ends the episode
    back = detect_series(_indexed([1.0, 1.0] + [0.5] * 4 + [1.0] * 3), st, rules=SPEED)
    assert [e.kind for e in back] == ["collapse", "recovered"]
    # once the level has its own reference, a collapse is judged against it, not the prior
    late = detect_series(_indexed([1.0, 1.0] + [1.1] * 8 + [0.6] * 3), st, rules=SPEED)
    assert [(e.kind, e.prior) for e in late] == [("collapse", False)] and late[0].reference == pytest.approx(1.1)
    # a healthy index a little under its curve (the soak's prompts slower than the measurement's) is no collapse
    assert detect_series(_indexed([1.0, 1.0] + [0.8] * 20), st, rules=SPEED) == []
    # windows without a prior (a curve that does not know one request's spread yet) wait for the reference
    det, judged = ChangeDetector(st, rules=SPEED), []
    for w in _indexed([1.0] * 8, prior=None):
        det.update(w)
        judged.append(det.judged()[0])
    assert judged == [False] * 7 + [True]
    assert detect_series(_indexed([1.0, 1.0] + [0.5] * 4, prior=None), st, rules=SPEED) == []


def test_a_slowdown_just_short_of_the_gate_does_not_drag_the_speed_index_reference_down() -> None:
    """A 30% slower engine read -15% to -24% a window in the simulated staged soak (bench/real_path.py, seed 3): those
    windows refined the reference (median of up to 30) until it met them, and the collapse came 16 minutes late. A
    window past half the gate the bad way no longer refines it, so the slowdown is judged against the healthy engine."""
    st = DetectorSettings(warmup_windows=2, reference_windows=5, confirm_windows=2)
    det = ChangeDetector(st, rules=SPEED)
    for w in _indexed([1.0, 1.0] + [1.0, 1.02, 0.98, 1.01, 0.99] + [0.85] * 10):
        assert det.update(w) == []
    assert det.state()["speed_index"].reference == pytest.approx(1.0)
    # then two windows past the gate: a collapse against the healthy reference (with the old rule the reference was
    # 0.85 by now, and 0.78 only -8%)
    events = detect_series(_indexed([1.0, 1.0] + [1.0, 1.02, 0.98, 1.01, 0.99] + [0.85] * 10 + [0.78] * 3), st, SPEED)
    assert [(e.kind, e.reference) for e in events] == [("collapse", pytest.approx(1.0))]
