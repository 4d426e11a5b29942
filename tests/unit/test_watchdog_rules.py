"""The watchdog's rules (harness/soak/watchdog.py) without an engine: each rule on made-up windows, and the rules
replayed over real soaks' windows giving the verdicts those soaks wrote (tests/fixtures/soak_records)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from harness.config.schema import Watchdog
from harness.detect.changepoint import WATCHED_CHANGES, ChangeDetector, MetricRule
from harness.records.types import SoakWindow
from harness.soak.disk import DiskWatch
from harness.soak.slice import detector_settings
from harness.soak.watchdog import (
    RSS_TREND_AFTER_S,
    Finding,
    WatchState,
    available_mib,
    cache_rules,
    disk_rule,
    drift_rules,
    error_rate_rule,
    headroom,
    judge,
    memory_rules,
    overload_cell,
    overload_rule,
    stall_rule,
)
from harness.soak.windows import Backlog, acceptance_sd, drafted_per_request, end_unix, load_state, window_figures

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "soak_records"
MIB = 2**20
# verdicts the slice gives itself, not the window rules: the engine's process, the load, the canary, the disk
NOT_WINDOW_RULES = ("crash", "hang", "restart_failed", "gave_up", "no_load", "divergence", "disk")


def win(i: int = 0, window_s: float = 60.0, **over: Any) -> dict[str, Any]:
    """The i-th window of a steady soak as windows.jsonl holds it: 10 requests, none failed, a flat engine."""
    t0 = 1_000_000.0 + i * window_s
    w: dict[str, Any] = {
        "config": "spec",
        "slice": "spec-s001",
        "t_start_unix": t0,
        "t_end_unix": t0 + window_s,
        "t_unix": t0 + window_s / 2,
        "engine_pid": 100,
        "engine_uptime_s": 3600.0 + i * window_s,
        "engine_restart": i == 0,
        "contaminated": False,
        "requests": 10,
        "errors": 0,
        "output_tps": 20.0,
        "decode_tps": 25.0,
        "ttft_p95_s": 0.5,
        "acceptance": None,
        "engine_rss_mib": 500.0,
        "engine_anon_mib": 400.0,
        "engine_memory_mib": 500.0,
        "prompt_cache_mib": None,
        "prompt_cache_cap_mib": None,
        "machine_memory_available_mib": 8000.0,
        "gpu_used_mib": None,
        "gpu_total_mib": None,
        "probe_max_s": 0.05,
        "max_chunk_gap_s": 0.2,
        "users": 4,
        "judged": True,
        "not_judged_why": None,
        "memory_headroom_s": None,
        "memory_slope_mib_per_h": None,
        "gpu_headroom_s": None,
        "gpu_slope_mib_per_h": None,
    }
    w.update(over)
    return w


def typed(w: dict[str, Any]) -> SoakWindow:
    return SoakWindow.from_dict(w)


# ---- stall ---------------------------------------------------------------------------------------------------------
def test_stall_floor_then_only_a_pause_half_again_longer_then_afresh_after_a_restart() -> None:
    wd, state = Watchdog(stall_warn_s=5.0), WatchState()
    assert stall_rule(typed(win(probe_max_s=4.9)), wd, state) is None  # under the floor
    first = stall_rule(typed(win(probe_max_s=5.0, max_chunk_gap_s=4.0)), wd, state)
    assert first is not None and first.kind == "stall" and first.metric == "longest_stall_s"
    assert first.evidence["longest_stall_s"] == 5.0 and first.evidence["onset_unix"] == win()["t_start_unix"]
    assert "floor 5 s" in first.message and "chunks of a stream 4.0 s" in first.message
    assert stall_rule(typed(win(probe_max_s=7.4)), wd, state) is None  # under 1.5 x the 5 s already named
    assert stall_rule(typed(win(probe_max_s=7.5)), wd, state) is not None
    assert state.stall_flagged_s == 7.5
    state.engine_restarted()
    assert stall_rule(typed(win(probe_max_s=5.0)), wd, state) is not None


def test_a_stall_in_a_contaminated_window_is_not_judged() -> None:
    state = WatchState()
    assert stall_rule(typed(win(probe_max_s=60.0, contaminated=True)), Watchdog(), state) is None
    assert state.stall_flagged_s == 0.0


# ---- memory --------------------------------------------------------------------------------------------------------
def test_memory_headroom_from_the_engines_growth_over_the_fit_span() -> None:
    wd = Watchdog(memory_fit_s=1800.0)
    # 600 MiB/h for 30 min, 2000 MiB available: about 3.3 h
    hist = [win(i, engine_memory_mib=500.0 + 10.0 * i, machine_memory_available_mib=2000.0) for i in range(30)]
    now = win(30, engine_memory_mib=800.0, machine_memory_available_mib=2000.0)
    h, slope = headroom(hist, now, wd)
    assert slope == pytest.approx(600.0, rel=0.01)
    assert h == pytest.approx(2000.0 / 600.0 * 3600, rel=0.01)
    assert headroom(hist[:1], now, wd) == (None, None)  # under 3 points: no forecast
    other = [{**w, "engine_pid": 99} for w in hist]
    assert headroom(other, now, wd) == (None, None)  # another engine process's windows do not count
    flat = [win(i) for i in range(30)]
    assert headroom(flat, win(30), wd) == (None, 0.0)  # no growth: no headroom, a slope of 0


def test_memory_limit_caps_the_available_memory() -> None:
    w = win(machine_memory_available_mib=8000.0, engine_rss_mib=700.0, engine_anon_mib=900.0)
    assert available_mib(w, None) == 8000.0
    assert available_mib(w, 1200.0) == 300.0  # the limit less the larger of RSS and anon
    assert available_mib(w, 500.0) == 0.0


def test_memory_verdict_when_the_forecast_runs_out_within_the_horizon_once_per_engine() -> None:
    wd, state = Watchdog(memory_horizon_s=3600.0), WatchState()
    assert (
        memory_rules(typed(win(memory_headroom_s=3600.0, memory_slope_mib_per_h=100.0)), wd, state) == []
    )  # at the horizon: not within
    got = memory_rules(typed(win(memory_headroom_s=1800.0, memory_slope_mib_per_h=2000.0)), wd, state)
    assert [(f.kind, f.metric) for f in got] == [("memory", "engine_memory_mib")]
    assert (
        got[0].evidence["headroom_s"] == 1800.0
        and "runs out in 30 min" in got[0].message
        and "+2,000 MiB/h" in got[0].message
    )
    assert memory_rules(typed(win(memory_headroom_s=60.0, memory_slope_mib_per_h=2000.0)), wd, state) == []  # said once
    assert (
        len(memory_rules(typed(win(engine_pid=101, memory_headroom_s=60.0, memory_slope_mib_per_h=2000.0)), wd, state))
        == 1
    )
    gpu = memory_rules(
        typed(
            win(
                engine_pid=101,
                gpu_headroom_s=600.0,
                gpu_slope_mib_per_h=900.0,
                gpu_used_mib=30_000.0,
                gpu_total_mib=32_000.0,
            )
        ),
        wd,
        state,
    )
    assert [(f.kind, f.metric) for f in gpu] == [("memory", "gpu_used_mib")] and "2,000 MiB free" in gpu[0].message


def test_a_prompt_cache_cap_that_does_not_fit_warns_once_and_its_growth_is_a_memory_verdict() -> None:
    wd, state = Watchdog(memory_fit_s=1800.0), WatchState()
    hist = [
        win(i, prompt_cache_mib=100.0 + 50.0 * i, prompt_cache_cap_mib=8192.0, machine_memory_available_mib=1000.0)
        for i in range(12)
    ]
    got = cache_rules(typed(hist[-1]), hist, wd, state)
    assert [(f.kind, f.action) for f in got] == [("cache_cap", "record"), ("memory", None)]
    assert (
        got[1].evidence["onset_unix"] == hist[0]["t_end_unix"] and got[1].evidence["headroom_s"] < wd.memory_horizon_s
    )
    assert state.memory_warned_pid == 100
    assert cache_rules(typed(hist[-1]), hist, wd, state) == []  # once per engine
    fits = [{**w, "prompt_cache_cap_mib": 256.0} for w in hist[:2]]
    assert cache_rules(typed(fits[-1]), fits, wd, WatchState()) == []  # a cap that fits is by design


# ---- disk, error rate ----------------------------------------------------------------------------------------------
def test_disk_verdict_below_the_floor_and_when_the_rate_reaches_it_within_two_windows(tmp_path: Path) -> None:
    wd = Watchdog(disk_min_free_mib=1024.0, window_s=60.0)
    free = [5000 * MIB]
    disk = DiskWatch(tmp_path, wd, free=lambda: free[0])
    w = typed(win())
    assert disk_rule(w, disk.check(0.0)) is None  # plenty, no rate yet
    free[0] = 3000 * MIB  # 2000 MiB in 60 s: below the floor within 2 windows
    got = disk_rule(w, disk.check(60.0))
    assert got is not None and got.kind == "disk" and "fills at" in got.message
    assert got.evidence["free_mib"] == 3000.0 and got.evidence["window"]["requests"] == 10
    assert disk_rule(w, disk.check(120.0)) is None  # said once while the disk stays short
    low = DiskWatch(tmp_path, wd, free=lambda: 500 * MIB)
    got = disk_rule(w, low.check(0.0))
    assert got is not None and "below soak.watchdog.disk_min_free_mib" in got.message


def test_error_rate_needs_min_requests_and_the_threshold() -> None:
    wd = Watchdog(error_rate=0.2, min_requests=5)
    assert error_rate_rule(typed(win(requests=4, errors=4)), wd) is None  # too few to judge
    assert error_rate_rule(typed(win(requests=10, errors=1)), wd) is None
    got = error_rate_rule(typed(win(requests=10, errors=2)), wd)
    assert got is not None and got.kind == "error_rate" and got.message == "2 of 10 requests failed in the last window"
    assert error_rate_rule(typed(win(requests=0, errors=0)), Watchdog(min_requests=1)) is None


# ---- drift, and the order of a window's verdicts -------------------------------------------------------------------
def test_drift_once_per_metric_and_soak_and_not_before_min_windows() -> None:
    wd, state = Watchdog(drift_min_windows=6, drift_min_change=0.1), WatchState()
    # decode t/s falling 2 % a minute over 40 minutes, at one level
    wins = [win(i, decode_tps=25.0 * (1 - 0.02 * i)) for i in range(40)]
    assert drift_rules(wins[:5], wd.model_copy(update={"drift_min_span_s": 0.0}), state) == []
    assert drift_rules(wins[:30], wd, state) == []  # 29 minutes between the first window and the last: too short
    got = drift_rules(wins, wd, state)
    assert [(f.kind, f.metric) for f in got] == [("drift", "decode_tps")] and "falls" in got[0].message
    assert state.drift_flagged == {"decode_tps"}
    assert drift_rules(wins, wd, state) == []
    young = [win(i, engine_memory_mib=500.0 + 20 * i, engine_uptime_s=RSS_TREND_AFTER_S - 1) for i in range(30)]
    assert (
        drift_rules(young, wd, WatchState()) == []
    )  # engine memory in the engine's first 10 minutes: warm-up, not a leak


def test_a_trend_over_minutes_is_not_a_drift_the_same_over_hours_is() -> None:
    """CI's healthy soak (test_soak_healthy, 100 s of 10-s windows, nothing planted) gave a drift: baseline decode t/s
    "falls 14% over the soak", p = 0.00095, n = 10. A shared VM's speed moves that much over minutes on its own, so
    the trend test waits for ``drift_min_span_s`` (30 minutes) between its first window and its last."""
    wd = Watchdog(drift_min_windows=6, drift_min_change=0.1)
    minutes = [win(i, window_s=10.0, decode_tps=133.0 * (1 - 0.016 * i)) for i in range(10)]
    assert drift_rules(minutes, wd, WatchState()) == []
    assert [f.metric for f in drift_rules(minutes, wd.model_copy(update={"drift_min_span_s": 0.0}), WatchState())] == [
        "decode_tps"
    ]
    hours = [win(i, window_s=800.0, decode_tps=133.0 * (1 - 0.016 * i)) for i in range(10)]
    assert [f.metric for f in drift_rules(hours, wd, WatchState())] == ["decode_tps"]


def test_open_loop_drift_watches_the_decode_of_requests_that_ran_alone_not_per_request_decode() -> None:
    """The third two-hour soak (staged 0.15 -> 0.25 -> 0.2 -> 0.15 rps) gave a drift of per-request decode t/s, -49%
    over its hour: in an open loop that follows how many requests shared the engine. Open loop, the drift test takes
    the decode of requests that ran alone instead, over every level at once, as the change detector does."""
    wd = Watchdog(drift_min_windows=6, drift_min_change=0.1)
    levels = [-20] * 15 + [-15] * 15 + [-17] * 15 + [-20] * 15
    shared = [win(i, load_level=lv, load_settled=True, decode_tps=60.0 * (1 - 0.01 * i)) for i, lv in enumerate(levels)]
    assert [f.metric for f in drift_rules(shared, wd, WatchState(), open_loop=False)] == ["decode_tps"]
    assert drift_rules(shared, wd, WatchState(), open_loop=True) == []
    slower = [{**w, "alone_decode_tps": 70.0 * (1 - 0.006 * i)} for i, w in enumerate(shared)]
    got = drift_rules(slower, wd, WatchState(), open_loop=True)
    assert [f.metric for f in got] == ["alone_decode_tps"] and "falls" in got[0].message
    assert drift_rules(slower, wd, WatchState(), open_loop=False) == [drift_rules(shared, wd, WatchState())[0]]


def test_judge_gives_a_windows_verdicts_in_the_soaks_order(tmp_path: Path) -> None:
    wd, state = Watchdog(stall_warn_s=5.0, memory_horizon_s=3600.0), WatchState()
    w = win(probe_max_s=9.0, memory_headroom_s=600.0, memory_slope_mib_per_h=500.0, requests=10, errors=9)
    short = ("the results disk has 10 MiB free", {"free_mib": 10.0})
    got = judge(typed(w), [w], wd, state, [], short, open_loop=False)
    assert [f.kind for f in got] == ["stall", "memory", "disk", "error_rate"]


# ---- overload ------------------------------------------------------------------------------------------------------
def open_win(i: int, rps: float, served: float, queue: int, **over: Any) -> dict[str, Any]:
    """The i-th 20-s window of an open-loop soak at ``rps`` (its level), the engine completing ``served`` rps, the
    backlog ``queue`` at its end: a window as windows.jsonl holds it."""
    w = win(i, window_s=20.0, users=None, load_level=round(np.log(rps) / np.log(1.1)), asked_rps=rps, offered_rps=rps)
    w.update(scheduled=round(rps * 20), achieved_rps=served, outstanding_end=queue, late=0, draining=False)
    w.update(load_settled=False, backlog_inherited=False)
    w.update(over)
    return w


def _overloads(wins: list[dict[str, Any]], wd: Watchdog | None = None) -> list[tuple[int, Any]]:
    """(window index, finding) of every finding the rule gives as the soak's windows come, one state for the soak."""
    wd, state = wd or Watchdog(), WatchState()
    return [(i, f) for i in range(len(wins)) if (f := overload_rule(wins[: i + 1], wd, state)) is not None]


def test_a_queue_that_keeps_growing_at_one_rate_is_an_overload_once_naming_both_rates() -> None:
    """2 rps offered, 1.2 served: the backlog grows by 16 a window. The rule waits for three windows at the rate whose
    queue rose past Poisson noise (2 sqrt(arrivals) + 1 = 18.9) and past one window's arrivals (40, wandering 13.6)."""
    wins = [open_win(i, 2.0, 1.2, 16 * i) for i in range(8)]
    got = _overloads(wins)
    assert [i for i, _ in got] == [4]
    f = got[0][1]
    assert (f.kind, f.metric, f.action) == ("overload", "served_rps", None)
    assert f.evidence["served_rps"] == pytest.approx(1.2) and f.evidence["offered_rps"] == pytest.approx(2.0)
    assert f.evidence["backlog"] == [32, 48, 64] and f.evidence["onset_unix"] == wins[2]["t_start_unix"]
    assert f.message.startswith("the engine serves 1.2 rps of the 2 rps offered (about 2 rps asked): its queue grew 32")
    assert Watchdog().action("overload") == "record"


def test_a_backlog_that_wanders_or_changes_level_or_drains_is_no_overload() -> None:
    still = [open_win(i, 2.0, 2.0, q) for i, q in enumerate([5, 9, 4, 12, 6, 10, 7])]
    assert _overloads(still) == []
    # rising, but by less than the arrivals wander over the span
    slow = [open_win(i, 2.0, 1.9, 40 + 4 * i) for i in range(8)]
    assert _overloads(slow) == []
    # a level change inside the span: the rule waits for three windows at the new rate
    ramp = [open_win(i, 2.0 if i < 5 else 4.0, 1.2, 16 * i) for i in range(7)]
    assert [i for i, _ in _overloads(ramp)] == [4]
    assert [i for i, _ in _overloads(ramp[:4] + ramp[5:])] == []
    # a drain in the span (the queue a heavier level left): not this rate's overload
    drain = [open_win(i, 2.0, 1.2, 16 * i, draining=i == 3) for i in range(6)]
    assert [i for i, _ in _overloads(drain)] == []


def test_a_fresh_engine_is_judged_afresh_and_contamination_is_named() -> None:
    wins = [open_win(i, 2.0, 1.2, 16 * i, contaminated=i == 3) for i in range(6)]
    wins += [open_win(i, 2.0, 1.2, 16 * (i - 6), engine_pid=200) for i in range(6, 12)]
    state, wd = WatchState(), Watchdog()
    got = []
    for i in range(len(wins)):
        if wins[i]["engine_pid"] == 200 and wins[i - 1]["engine_pid"] == 100:
            state.engine_restarted()
        if (f := overload_rule(wins[: i + 1], wd, state)) is not None:
            got.append((i, f))
    assert [i for i, _ in got] == [4, 10]
    assert got[0][1].evidence["contaminated_windows"] == 1 and "other processes took the CPU in 1" in got[0][1].message


def test_a_rate_the_engine_served_earlier_and_no_longer_does_is_a_collapse_of_the_served_rate() -> None:
    """The engine served 2 rps with a backlog that held still; then it sustains 1.0 (halved): a ``collapse`` of
    ``served_rps``, whatever the queue does to the windows the change detector judges. At 1.6 of 2 (within 25% of
    what it served: an engine near its capacity) it is an overload, not a collapse."""
    served = [open_win(i, 2.0, 2.0, 6, load_settled=True) for i in range(6)]
    halved = served + [open_win(i, 2.0, 1.0, 6 + 20 * (i - 5)) for i in range(6, 12)]
    got = _overloads(halved)
    assert [(i, f.kind, f.metric) for i, f in got] == [(8, "collapse", "served_rps")]
    ev = got[0][1].evidence
    assert ev["served_before_rps"] == pytest.approx(2.0) and ev["relative_change"] == pytest.approx(-0.5)
    assert got[0][1].message.startswith("served_rps -50%: the engine sustains 1 rps at about 2 rps asked")
    near = served + [open_win(i, 2.0, 1.6, 6 + 10 * (i - 5)) for i in range(6, 14)]
    assert [(f.kind, round(f.evidence["served_rps"], 6)) for _, f in _overloads(near)] == [("overload", 1.6)]
    # other processes took the CPU in one of those windows: said, and recorded rather than acted on
    busy = [{**w, "contaminated": i == 7} for i, w in enumerate(halved)]
    [(_, f)] = _overloads(busy)
    assert (f.kind, f.action) == ("collapse", "record") and "other processes took the CPU in 1" in f.message
    assert got[0][1].action is None
    # a heavier rate than any it served before is an overload, even at half of it
    heavier = served + [open_win(i, 4.0, 2.0, 40 * (i - 5)) for i in range(6, 12)]
    assert [f.kind for _, f in _overloads(heavier)] == ["overload"]
    # an open loop only: judge gives it there, never in a closed loop
    w = halved[9]
    assert [f.kind for f in judge(typed(w), halved[:10], Watchdog(), WatchState(), [], None, True)] == ["collapse"]
    assert judge(typed(w), halved[:10], Watchdog(), WatchState(), [], None, False) == []


def test_an_overload_is_named_in_the_soak_table_and_the_verdict_cell_without_failing_the_soak() -> None:
    from harness.config.policy import verdict_fails
    from harness.report.verdict import soak_verdict

    [(_, f)] = _overloads([open_win(i, 2.0, 1.2, 16 * i) for i in range(5)])
    v = {"kind": f.kind, "metric": f.metric, "action": Watchdog().action(f.kind), "evidence": f.evidence}
    assert not verdict_fails(v)
    cell = overload_cell(v)
    assert cell == "~2 rps: served 1.2 of 2 offered"
    soak = {"status": "ok", "soak_s": 3600, "windows": 60, "judged_windows": 57, "overloads": [cell]}
    assert soak_verdict(soak) == "ok (1.00 h, 57/60 windows judged); overloaded at ~2 rps: served 1.2 of 2 offered"


# ---- real soaks ----------------------------------------------------------------------------------------------------
def _folder(name: str) -> tuple[Watchdog, bool, list[dict[str, Any]], list[dict[str, Any]]]:
    sc = yaml.safe_load((RECORDS / name / "scenario.yaml").read_text())
    read = lambda f: [json.loads(line) for line in (RECORDS / name / f).read_text().splitlines()]
    return (
        Watchdog(**sc["soak"]["watchdog"]),
        sc["soak"].get("arrival") is not None,
        read("windows.jsonl"),
        read("verdicts.jsonl"),
    )


# the collapse rules as they were before open-loop soaks judged the decode of requests that ran alone: per-request
# decode t/s judged in every soak, acceptance at 15% (the rules the open-loop soaks recorded before then ran with)
RULES_BEFORE_ALONE = {
    m: replace(r, loop=None, min_change=0.15 if m == "acceptance" else r.min_change)
    for m, r in WATCHED_CHANGES.items()
    if m != "alone_decode_tps"
}
WRITTEN_WITH: dict[str, dict[str, MetricRule]] = {"staged_2h": RULES_BEFORE_ALONE, "alone_2h": RULES_BEFORE_ALONE}


def _replay(
    wd: Watchdog, open_loop: bool, windows: list[dict[str, Any]], rules: dict[str, MetricRule] | None = None
) -> list[tuple[str, Any]]:
    """As the slice judges: the detector fed each window (as replay_detector), a new WatchState per slice (drift
    named once per soak), the history ending with the window judged: (configuration, finding) in order. ``rules``:
    the change detector's (None: today's)."""
    detectors: dict[str, ChangeDetector] = {}
    history: dict[str, list[dict[str, Any]]] = {}
    states: dict[str, tuple[str, WatchState]] = {}
    got = []
    for w in windows:
        c = w["config"]
        det = detectors.setdefault(c, ChangeDetector(detector_settings(wd), rules))
        if c not in states or states[c][0] != w["slice"]:
            states[c] = (w["slice"], WatchState(drift_flagged=states[c][1].drift_flagged if c in states else set()))
        if w.get("engine_restart"):
            det.engine_restarted()
        h = history.setdefault(c, [])
        # the memory forecast the window recorded is the one headroom() gives from the windows before it
        assert headroom(h, w, wd) == (w["memory_headroom_s"], w["memory_slope_mib_per_h"])
        events = det.update(w)
        h.append(w)
        got += [(c, f) for f in judge(typed(w), h, wd, states[c][1], events, None, open_loop)]
    return got


# false verdicts a fixture's soak wrote that today's rules no longer give, with the fix named: (config, kind, metric)
FALSE_THEN: dict[str, list[tuple[str, str, str]]] = {
    # windows of 0 or 1 long-prompt request (output 0.0 and ~2 t/s by turns): the score the 0.0 windows left behind
    # made two of them a -93% collapse; a window back at the reference now clears the score
    "cache": [("cache-fits", "collapse", "output_tps")],
    # two users' per-request decode t/s flipping between taking turns and sharing a batch (53 -> 7 -> 52 -> 7 at a
    # flat output t/s), "falls 101%" over 60 s: the trend test now waits for drift_min_span_s (30 minutes)
    "drift": [("baseline", "drift", "decode_tps")],
    # per-request decode t/s at one open-loop level: one window at -66% (4.3 sigmas) and one at -41% an hour later
    # made 6.6; one window now adds at most threshold / confirm_windows (2.5), so two windows make 4.8
    "alone_2h": [("ngram-map-k", "collapse", "decode_tps"), ("ngram-map-k", "collapse", "acceptance")],
}
# verdicts a fixture's windows give under the rules its soak ran with that the soak did not write: the n-gram
# acceptance collapse at 15% (-18%, 7.7 sigmas mostly from one window) comes 31 minutes later at -63% (today's rule,
# 30% against the requests' spread, gives none: test_acceptance_judged_against_the_spread_of_its_requests...)
# The staged soak's 0.5-rps level, which neither configuration served (its queue grew 36 -> 60 while the engine
# sustained 0.33 rps): an overload, recorded (test_the_queue_a_heavier_level_left_is_not_judged_at_the_lighter_level)
GIVEN_NOW: dict[str, list[tuple[str, str, str]]] = {
    "alone_2h": [("ngram-map-k", "collapse", "acceptance")],
    "staged_2h": [("baseline", "overload", "served_rps"), ("ngram-map-k", "overload", "served_rps")],
}
# fixtures whose collapse scores were written before one window's share was capped: the replay's is no higher
SCORE_BEFORE_CAP = {"gauntlet", "alone_2h"}


@pytest.mark.parametrize(
    "name",
    [
        "cache",
        "stalls",
        "drift",
        "faults",
        "staged_2h",
        "alone_2h",
        "gauntlet",
        "alone_planted",
        "overload_planted",
        "busy_staged",
        "busy_diurnal",
        "busy_steady",
    ],
)
def test_rules_replayed_over_a_real_soaks_windows_give_the_verdicts_it_wrote(name: str) -> None:
    wd, open_loop, windows, verdicts = _folder(name)
    got = _replay(wd, open_loop, windows, WRITTEN_WITH.get(name))
    now = GIVEN_NOW.get(name, [])
    assert [k for c, f in got if (k := (c, f.kind, f.metric)) in now] == now
    got = [(c, f) for c, f in got if (c, f.kind, f.metric) not in now]
    false = FALSE_THEN.get(name, [])
    want = [
        v for v in verdicts if v["kind"] not in NOT_WINDOW_RULES and (v["config"], v["kind"], v["metric"]) not in false
    ]
    assert len(want) == len([v for v in verdicts if v["kind"] not in NOT_WINDOW_RULES]) - len(false)
    assert [(c, f.kind, f.metric) for c, f in got] == [(v["config"], v["kind"], v["metric"]) for v in want]
    for (_, f), v in zip(got, want, strict=True):
        # the slice adds the series that moved with it (harness/soak/explain.py) to evidence and message
        written, replayed = {k: v["evidence"][k] for k in f.evidence}, json.loads(json.dumps(f.evidence))
        if name in SCORE_BEFORE_CAP and "score" in replayed:
            assert replayed.pop("score") <= written.pop("score")
        assert written == replayed
        if name != "stalls":  # that soak ran before the stall message took its present wording
            assert v["message"].removeprefix("attached server: ").startswith(f.message)


def test_with_a_third_of_a_core_taken_the_speed_index_judges_and_acts_beyond_what_the_lost_cpu_explains() -> None:
    # the live staged soak with bench/cpu_taker.py taking 0.33 cores the whole run (fixture busy_staged): every window
    # contaminated, so the per-level figures learn nothing, and the speed index, judged at any load, still looks
    wd, open_loop, windows, written = _folder("busy_staged")
    assert all(w["contaminated"] and w["cpu"]["other_cores"] >= 0.3 for w in windows)
    det = ChangeDetector(detector_settings(wd))
    judged = []
    for w in windows:
        det.update(w)
        judged.append(det.judged())
    assert judged[: wd.warmup_windows] == [(False, "warm-up")] * wd.warmup_windows
    assert all(ok for ok, _ in judged[wd.warmup_windows :])  # 28 of 31: all but the warm-up
    # its one verdict: the engine slowed by the taker did not serve the 0.5-rps level, a finding recorded
    got = _replay(wd, open_loop, windows)
    assert [(f.kind, f.metric, f.action) for _, f in got] == [("overload", "served_rps", None)]
    assert "other processes took the CPU in 3 of these windows" in got[0][1].message
    assert [v["kind"] for v in written] == ["overload"] and written[0]["action"] == "record"

    # the same soak slowed from its 20th window: a collapse of the speed index, named as contaminated. A third of a
    # core (0.35, and 0.02 of steal, of the 2 cores in use) explains at most 41% of a slowdown (CPU_AMPLIFICATION: it
    # cost solo decode 37%, bench/cpu_cost.py): at 0.4 the engine is slower than that and the rule's 20% gate beside
    # it (under 0.5 of its reference), so it is acted on (stop_config); at 0.7 it is within both: recorded
    def slowed(factor: float) -> list[Finding]:
        planted = [
            {**w, "speed_index": w["speed_index"] * factor} if i >= 20 and w.get("speed_index") is not None else w
            for i, w in enumerate(windows)
        ]
        return [f for _, f in _replay(wd, open_loop, planted) if f.kind == "collapse"]

    stopped, mild = slowed(0.4), slowed(0.7)
    assert [(f.metric, f.action) for f in stopped] == [("speed_index", None)]
    assert [(f.metric, f.action) for f in mild] == [("speed_index", "record")]
    onset = stopped[0].evidence["onset_unix"]
    assert windows[20]["t_start_unix"] <= onset <= windows[22]["t_end_unix"]
    msg = stopped[0].message
    assert "other processes took up to 0.3" in msg and "in 2 of its last 2 windows" in msg
    assert "which explains at most 41% of a slowdown, not this one" in msg and "recorded" not in msg, msg
    lost = stopped[0].evidence["lost_cpu"]
    assert lost["explained"] == pytest.approx(0.41, abs=0.02) and lost["ratio"] < 0.5, lost
    assert "so it is recorded, not acted on" in mild[0].message
    # the closed-loop ramp under the same taker (fixture busy_ramp): a dip of the index, recorded, then its recovery
    wd, open_loop, windows, written = _folder("busy_ramp")
    got = _replay(wd, open_loop, windows)
    assert [(f.kind, f.metric, f.action) for _, f in got] == [
        ("collapse", "speed_index", "record"),
        ("recovered", "speed_index", "record"),
    ]
    assert [(v["kind"], v["action"]) for v in written] == [("collapse", "record"), ("recovered", "record")]
    msg = got[0][1].message
    assert msg.startswith("speed_index -24% against its reference 1 at any load level (now 0.762)"), msg
    assert "other processes took up to 0.34 cores" in msg and "recorded, not acted on" in msg


def test_a_stall_long_past_does_not_make_two_windows_one_request_short_a_collapse() -> None:
    """The gauntlet soak in CI (fixture gauntlet_ci, run 20261202T213346Z): one user, 32-token answers, 10-s windows of
    4 or 5 requests (12.7 or 15.9 t/s by turns). The 4-s and 8-s pauses' windows pumped output_tps's score to 11
    sigmas, and fourteen windows later two windows one request short (-20.07%, min_change 20%) were a collapse that
    stopped a healthy engine, 15 s before the planted collapse began. A window back at the reference clears the score:
    the stalls stay stall verdicts, and the collapse is the planted one, in the second window it froze the engine (one
    window adds at most threshold / confirm_windows to the score: the run stopped after the first, so it is repeated)."""
    wd, open_loop, windows, verdicts = _folder("gauntlet_ci")
    written = [(v["kind"], v["metric"]) for v in verdicts if v["kind"] not in NOT_WINDOW_RULES]
    assert written == [("stall", "longest_stall_s")] * 2 + [("collapse", "output_tps")]
    false_onset = next(v for v in verdicts if v["kind"] == "collapse")["evidence"]["onset_unix"]
    planted = windows[-1]  # the plant froze the engine in the last window: nothing streamed, then the run stopped
    assert planted["output_tps"] == 0.0 and false_onset < planted["t_start_unix"]
    span = planted["t_end_unix"] - planted["t_start_unix"]
    frozen_on = {
        **planted,
        **{k: planted[k] + span for k in ("t_start_unix", "t_end_unix", "t_unix")},
        "engine_uptime_s": planted["engine_uptime_s"] + span,
    }
    frozen_on["memory_headroom_s"], frozen_on["memory_slope_mib_per_h"] = headroom(windows, frozen_on, wd)
    assert [(f.kind, f.metric) for _, f in _replay(wd, open_loop, windows)] == written[:2]
    got = _replay(wd, open_loop, [*windows, frozen_on])
    assert [(f.kind, f.metric) for _, f in got] == written
    collapse = got[-1][1]
    assert collapse.evidence["t_unix"] == frozen_on["t_unix"] and collapse.evidence["relative_change"] == -1.0
    assert collapse.evidence["onset_unix"] == planted["t_unix"]
    # the score the stalls left is gone by the windows the false collapse was judged on
    det = ChangeDetector(detector_settings(wd))
    for w in windows[:-1]:
        det.update(w)
    assert det.state()["output_tps"].score < detector_settings(wd).threshold


def test_the_queue_a_heavier_level_left_is_not_judged_at_the_lighter_level() -> None:
    """The two-hour staged soak (scenarios/soak-2h-cpu.yaml; fixture staged_2h): back at 0.2 rps after 0.5 and 0.3, the
    engine still served the heavier levels' queue at full concurrency (decode ~12 t/s a request, against 45 at 0.2 rps
    with an empty queue), and the windows whose fall Poisson arrivals hid were judged: a false -74% decode collapse
    (replayed as written above). With the backlog's state worked out as the slice now does (load_state, window by
    window), every window still holding that queue is left out and no collapse is flagged; the heavier level itself,
    where the queue grew, is an ``overload`` (recorded: a finding about 0.5 rps, not a failure)."""
    wd, open_loop, windows, verdicts = _folder("staged_2h")
    assert open_loop and any(v["kind"] == "collapse" for v in verdicts)
    redone: list[dict[str, Any]] = []
    by_slice: dict[str, Backlog] = {}
    for recorded in windows:
        w = {k: v for k, v in recorded.items() if k not in ("draining", "load_settled", "backlog_inherited")}
        earlier = by_slice.setdefault(w["slice"], Backlog())
        w.update(load_state(earlier, w))
        earlier.add(w)
        redone.append(w)
    assert sum(bool(w["backlog_inherited"]) for w in redone) >= 10
    got = _replay(wd, open_loop, redone, RULES_BEFORE_ALONE)
    assert [(c, f.kind) for c, f in got] == [("baseline", "overload"), ("ngram-map-k", "overload")]
    assert all(f.evidence["asked_rps"] == pytest.approx(0.5) and f.evidence["served_rps"] < 0.4 for _, f in got)
    assert Watchdog().action("overload") == "record"


def _with_alone_decode(name: str) -> list[dict[str, Any]]:
    """The soak's windows with the decode of their requests that ran alone worked out from its request records as the
    slice now does (``window_figures`` over the requests each window took, every request's start and end for the
    overlaps)."""
    _, _, windows, _ = _folder(name)
    recs = [json.loads(line) for line in (RECORDS / name / "requests.jsonl").read_text().splitlines()]
    out = []
    for w in windows:
        mine = [r for r in recs if r["config"] == w["config"]]
        ended = [r for r in mine if w["t_start_unix"] <= end_unix(r) < w["t_end_unix"]]
        intervals = [(float(r["start_unix_s"]), end_unix(r)) for r in mine]
        fig = window_figures(ended, ended, w["t_start_unix"], w["t_end_unix"], True, None, intervals)
        sd = {**w["count_sd"], "alone_decode_tps": fig["count_sd"]["alone_decode_tps"]}
        out.append(
            {**w, "alone_requests": fig["alone_requests"], "alone_decode_tps": fig["alone_decode_tps"], "count_sd": sd}
        )
    return out


def test_the_decode_of_requests_that_ran_alone_holds_where_per_request_decode_swings_and_sees_a_slower_engine() -> None:
    """The second two-hour staged soak (0.15 -> 0.25 -> 0.2 -> 0.15 rps, fixture alone_2h, docs/detector.md#alone-decode):
    at one Poisson level the windows' median per-request decode ran from 25 to 77 t/s as requests happened to share the
    engine, and back at 0.15 rps two windows of shared requests against a reference learned from quiet ones gave a
    false decode collapse (replayed as written above). The requests that ran alone decode at the engine's own speed
    at every level: judged on them the soak gives no verdict, and the same windows with those requests' decode
    halved from minute 30 on give a collapse within three windows that have such requests."""
    wd, open_loop, _, verdicts = _folder("alone_2h")
    assert open_loop and [(v["config"], v["kind"], v["metric"]) for v in verdicts] == [
        ("baseline", "collapse", "decode_tps"),
        ("ngram-map-k", "collapse", "decode_tps"),
        ("ngram-map-k", "collapse", "acceptance"),
    ]
    redone = _with_alone_decode("alone_2h")
    level = [
        w["decode_tps"] for w in redone if w["config"] == "baseline" and w["load_level"] == -20 and w["decode_tps"]
    ]
    alone = [w["alone_decode_tps"] for w in redone if w["config"] == "baseline" and w["alone_decode_tps"]]
    assert max(level) / min(level) > 2.5 and max(alone) / min(alone) < 1.6 and len(alone) >= 20
    assert [(c, f.kind, f.metric) for c, f in _replay(wd, open_loop, redone)] == []
    onset = 1800.0
    planted = [
        {**w, "alone_decode_tps": w["alone_decode_tps"] / 2}
        if w["config"] == "baseline" and w["soak_t_start_s"] >= onset and w["alone_decode_tps"] is not None
        else w
        for w in redone
    ]
    got = [(c, f) for c, f in _replay(wd, open_loop, planted) if f.kind == "collapse"]
    assert [(c, f.metric) for c, f in got] == [("baseline", "alone_decode_tps")]
    after = [w for w in planted if w["config"] == "baseline" and w["soak_t_start_s"] >= onset and w["alone_decode_tps"]]
    assert got[0][1].evidence["t_unix"] <= after[2]["t_unix"]


def test_a_slowdown_planted_in_an_open_loop_soak_is_a_collapse_of_the_decode_of_requests_that_ran_alone() -> None:
    """The open-loop plant (tests/long/test_soak_alone.py, run 20261203T141431Z-alone, fixture alone_planted): Poisson
    arrivals at 0.3 rps on the real llama-server, which the test froze for 60% of every 0.2 s once the first window was
    judged. The requests that ran alone decoded at 75-91 t/s before and about 30 after; replayed, the windows before the
    plant give nothing and the first slowed window starts a collapse of that series, confirmed within three windows.
    Per-request decode t/s, which swings with how requests overlap, is never judged in an open loop."""
    wd, open_loop, windows, verdicts = _folder("alone_planted")
    assert open_loop
    slowed = next(i for i, w in enumerate(windows) if (w["alone_decode_tps"] or 99) < 50)
    before = [w["alone_decode_tps"] for w in windows[:slowed]]
    after = [w["alone_decode_tps"] for w in windows[slowed:] if w["alone_decode_tps"] is not None]
    assert min(before) > 70 and max(after) < 0.5 * min(before) and len(after) >= 3, (before, after)
    assert sum(w["judged"] for w in windows[:slowed]) >= 2  # the reference was built and judged against first
    got = _replay(wd, open_loop, windows)
    assert [f.metric for _, f in got][:1] == ["alone_decode_tps"] and {f.kind for _, f in got} == {"collapse"}
    first = got[0][1]
    assert first.evidence["onset_unix"] == windows[slowed]["t_unix"] and first.evidence["relative_change"] <= -0.4
    assert first.evidence["t_unix"] <= windows[slowed + 3]["t_unix"]
    assert not [f for _, f in got if f.metric == "decode_tps"]
    assert [v["metric"] for v in verdicts] == [f.metric for _, f in got]  # what the live soak wrote


def test_an_engine_slowed_under_the_rate_it_served_is_a_collapse_of_the_served_rate_first() -> None:
    """The live check tests/long/test_soak_overload.py (run 20261203T163711Z-overload, fixture overload_planted): 0.5
    rps of short prompts, served with a still backlog for three windows; then the engine frozen for 95% of every
    0.2 s. It sustained 0.07 rps, the queue grew 7 -> 18 -> 22 -> 31, and the first verdict was the collapse of
    ``served_rps`` that stopped the configuration (the change detector's output t/s and TTFT collapses came in the
    same window)."""
    wd, open_loop, windows, verdicts = _folder("overload_planted")
    assert open_loop and (verdicts[0]["kind"], verdicts[0]["metric"]) == ("collapse", "served_rps")
    served = [w for w in windows if w["load_settled"]]
    assert len(served) >= 3 and all(w["late"] == 0 for w in served)
    got = _replay(wd, open_loop, windows)
    first = got[0][1]
    assert (first.kind, first.metric) == ("collapse", "served_rps") and first.evidence["relative_change"] < -0.5
    assert first.evidence["served_before_rps"] == pytest.approx(0.5) and first.evidence["backlog"] == [7, 18, 22]
    assert [(f.kind, f.metric) for _, f in got] == [(v["kind"], v["metric"]) for v in verdicts]


def test_the_third_two_hour_soak_gives_no_verdict_once_drift_watches_the_decode_of_requests_that_ran_alone() -> None:
    """The third two-hour staged soak (scenarios/soak-2h-cpu.yaml, fixture alone3_2h), the first to judge the decode of
    requests that ran alone live: 1,362 requests, none failed, no collapse, 30 and 25 windows judged; its one verdict a
    drift of per-request decode t/s (-49% at 55 min, recorded), which the drift test still took in an open loop.
    Replayed as written (the drift test as in a closed loop), that verdict; with today's rules, none at all."""
    wd, open_loop, windows, verdicts = _folder("alone3_2h")
    assert open_loop and [(v["config"], v["kind"], v["metric"]) for v in verdicts] == [
        ("baseline", "drift", "decode_tps")
    ]
    assert sum(w["judged"] for w in windows if w["config"] == "baseline") == 30
    assert [(c, f.kind, f.metric) for c, f in _replay(wd, False, windows)] == [("baseline", "drift", "decode_tps")]
    assert _replay(wd, open_loop, windows) == []


def _with_acceptance_spread(name: str, windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows with acceptance's count sd worked out as the slice now does: the binomial over the window's drafted
    tokens, or the spread between the requests it took when wider (``acceptance_sd``)."""
    recs = [json.loads(line) for line in (RECORDS / name / "requests.jsonl").read_text().splitlines()]
    out = []
    for w in windows:
        ended = [r for r in recs if r["config"] == w["config"] and w["t_start_unix"] <= end_unix(r) < w["t_end_unix"]]
        drafted = (w.get("counters") or {}).get("draft_tokens")
        sd = {**w["count_sd"], "acceptance": acceptance_sd(w.get("acceptance"), drafted, drafted_per_request(ended))}
        out.append({**w, "count_sd": sd})
    return out


def test_acceptance_judged_against_the_spread_of_its_requests_holds_on_a_healthy_soak_and_sees_a_halving() -> None:
    """n-gram acceptance follows the prompt (0.14 to 1.0 a window at one level in the second two-hour soak, fixture
    alone_2h), so the binomial over a window's few hundred drafted tokens understates how far a window wanders: the
    spread between the window's requests is its count sd. Even so a 15% fall is within what this soak's windows did
    (a collapse at 15%, as the soak wrote); at today's 30% there is none, and acceptance halved from minute 30 on
    (each request's, so its spread halves with it) is a collapse."""
    wd, open_loop, _, _ = _folder("alone_2h")
    redone = _with_acceptance_spread("alone_2h", _with_alone_decode("alone_2h"))
    ngram = [w for w in redone if w["config"] == "ngram-map-k" and w.get("acceptance") is not None]
    binomial = [acceptance_sd(w["acceptance"], w["counters"]["draft_tokens"]) or 0.0 for w in ngram]
    spread = [w["count_sd"]["acceptance"] for w in ngram]
    assert len(ngram) >= 30 and float(np.median(spread)) > 2 * float(np.median(binomial)), (spread, binomial)
    at_15 = {**WATCHED_CHANGES, "acceptance": replace(WATCHED_CHANGES["acceptance"], min_change=0.15)}
    assert [(c, f.kind) for c, f in _replay(wd, open_loop, redone, at_15) if f.metric == "acceptance"] == [
        ("ngram-map-k", "collapse")
    ]
    assert [(c, f.kind) for c, f in _replay(wd, open_loop, redone) if f.metric == "acceptance"] == []
    onset = 1800.0

    def halved(w: dict[str, Any]) -> dict[str, Any]:
        sd = w["count_sd"]["acceptance"]
        return {**w, "acceptance": w["acceptance"] / 2, "count_sd": {**w["count_sd"], "acceptance": sd and sd / 2}}

    planted = [
        halved(w)
        if w["config"] == "ngram-map-k" and w["soak_t_start_s"] >= onset and w.get("acceptance") is not None
        else w
        for w in redone
    ]
    got = [(c, f.metric) for c, f in _replay(wd, open_loop, planted) if f.kind == "collapse"]
    assert got == [("ngram-map-k", "acceptance")]
