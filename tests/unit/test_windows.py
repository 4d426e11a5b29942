"""Soak window figures (harness/soak/windows.py) and the rules they feed: throughput from the tokens streamed inside a
window, count-implied noise, the open-loop backlog, drift per load level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.detect.changepoint import ChangeDetector, ChangeEvent, detect_series
from harness.detect.trend import trend
from harness.soak.watchdog import drift_points
from harness.soak.windows import (
    Backlog,
    chunk_times,
    load_state,
    outstanding,
    p95_sd,
    ran_alone,
    share_sd,
    streamed,
    take_ended,
    throughput_sd,
    ttft_sd,
    window_figures,
)

T0 = 1_700_000_000.0
SOAK3 = Path(__file__).resolve().parents[1] / "fixtures" / "soak_records" / "alone3_2h" / "windows.jsonl"


def _rec(
    start: float,
    ttft: float,
    gaps: list[float],
    tokens: list[int] | None = None,
    status: str = "ok",
    decode_tps: float | None = 20.0,
) -> dict[str, Any]:
    n = sum(tokens) if tokens is not None else len(gaps) + 1
    return {
        "start_unix_s": start,
        "ttft_s": ttft,
        "itl_s": gaps,
        "chunk_tokens": tokens,
        "output_tokens": n,
        "e2e_s": ttft + sum(gaps),
        "status": status,
        "decode_tps": decode_tps,
    }


def test_chunks_are_rebuilt_from_start_ttft_and_gaps() -> None:
    ct = chunk_times(_rec(T0, 1.0, [0.5, 0.5, 1.0], [1, 2, 1, 3]))
    assert ct is not None
    times, tok = ct
    assert list(times - T0) == pytest.approx([1.0, 1.5, 2.0, 3.0]) and list(tok) == [1, 2, 1, 3]
    # a stream that did not say its chunks' tokens: the output tokens spread evenly over the chunks
    blind = {**_rec(T0, 1.0, [1.0, 1.0]), "chunk_tokens": None, "output_tokens": 9}
    assert list(chunk_times(blind)[1]) == [3.0, 3.0, 3.0]  # type: ignore[index]  # a record with chunk times: not None
    assert chunk_times({"start_unix_s": T0, "ttft_s": None, "status": "error"}) is None


def test_a_request_spanning_two_windows_counts_in_both() -> None:
    r = _rec(T0, 1.0, [0.5] * 10)  # chunks at 1.0, 1.5, ... 6.0
    assert streamed([r], T0, T0 + 3.0) == (4.0, 1)
    assert streamed([r], T0 + 3.0, T0 + 10.0) == (7.0, 1)
    # per-request figures keep the window the request ended in
    first = window_figures([], [r], T0, T0 + 3.0, open_loop=False, users=1)
    second = window_figures([r], [r], T0 + 3.0, T0 + 10.0, open_loop=False, users=1)
    assert first["requests"] == 0 and first["output_tps"] == pytest.approx(4 / 3) and first["decode_tps"] is None
    assert second["requests"] == 1 and second["output_tps"] == pytest.approx(7 / 7) and second["decode_tps"] == 20.0


def test_a_window_takes_the_requests_that_ended_before_its_end_and_the_last_takes_all() -> None:
    early, inside, later = _rec(T0 - 20, 0.5, [0.5]), _rec(T0 + 2, 0.5, [0.5]), _rec(T0 + 9, 0.5, [0.5] * 4)
    ended, rest = take_ended([early, inside, later], T0 + 10.0)
    assert ended == [early, inside] and rest == [later]  # a record that came late joins the next window judged
    assert take_ended([later], T0 + 10.0, last=True) == ([later], [])


def _closed_loop_user(
    seconds: float, e2e_s: float = 1.62, tokens: int = 32, ttft_s: float = 1.12
) -> list[dict[str, Any]]:
    """One closed-loop user: 32-token answers back to back (the CI soak: 4 or 5 finish per 8-s window)."""
    out, t = [], T0
    gap = (e2e_s - ttft_s) / (tokens - 1)
    while t < T0 + seconds:
        out.append(_rec(t, ttft_s, [gap] * (tokens - 1)))
        t += e2e_s + 0.05
    return out


def test_streamed_throughput_is_not_quantised_by_whole_requests() -> None:
    recs = _closed_loop_user(200.0)
    per_finished, per_streamed = [], []
    for k in range(2, 22):
        t0, t1 = T0 + 8.0 * k, T0 + 8.0 * (k + 1)
        ended = [r for r in recs if t0 <= r["start_unix_s"] + r["e2e_s"] < t1]
        per_finished.append(sum(r["output_tokens"] for r in ended) / 8.0)
        per_streamed.append(window_figures(ended, recs, t0, t1, open_loop=False, users=1)["output_tps"])
    # counted by finished requests: 4 or 5 of them, 16 or 20 t/s; by streamed tokens: values between, a smaller spread
    assert len(set(per_finished)) == 2 and max(per_finished) / min(per_finished) == pytest.approx(1.25)
    assert len({round(x, 3) for x in per_streamed}) > 2 and np.std(per_streamed) < 0.8 * np.std(per_finished)
    assert np.mean(per_streamed) == pytest.approx(np.mean(per_finished), rel=0.05)


def test_count_sds() -> None:
    assert throughput_sd(20.0, 5, open_loop=True, users=None) == pytest.approx(20 / 5**0.5)
    assert throughput_sd(20.0, 5, open_loop=False, users=1) == pytest.approx(2.0)  # half a request of five
    assert throughput_sd(20.0, 20, open_loop=False, users=4) == pytest.approx(20 * 0.5 * 2 / 20)
    assert throughput_sd(0.0, 0, open_loop=False, users=1) is None
    assert share_sd(0, 5) == pytest.approx((0.5 / 6 * (1 - 0.5 / 6) / 5) ** 0.5)
    assert p95_sd([1.0, 1.0, 1.0, 1.0, 3.0]) > 0 and p95_sd([1.0]) is None
    # open loop: a window that met no Poisson burst still says its p95 could have waited one answer's streaming time
    assert ttft_sd([0.3] * 12, [4.6] * 12, open_loop=True) == pytest.approx(4.6)
    assert ttft_sd([0.3] * 12, [4.6] * 12, open_loop=False) == 0.0


def _ci_windows(counts: list[int], tps_per_request: float = 32 / 8.0, noise_free: bool = True) -> list[dict[str, Any]]:
    """The failing CI soak as the detector saw it: one user, 8-s windows, output_tps from 4 or 5 finished requests."""
    out = []
    for i, n in enumerate(counts):
        tps = n * tps_per_request
        out.append(
            {
                "t_unix": T0 + 8.0 * i + 4,
                "users": 1,
                "contaminated": False,
                "output_tps": tps,
                "requests": n,
                "count_sd": {"output_tps": throughput_sd(tps, n, open_loop=False, users=1)},
            }
        )
    return out


def test_a_reference_that_agreed_exactly_cannot_make_one_request_ten_sigmas() -> None:
    counts = [5, 5, 5, 5, 5, 4, 4, 5, 4, 4, 5, 5, 4, 4, 4, 5]
    wins = _ci_windows(counts)
    assert [e for e in detect_series(wins) if e.kind == "collapse"] == []
    # the same windows without their count sd: the old false collapse ("-20%, 10 sigma")
    bare = [{k: v for k, v in w.items() if k != "count_sd"} for w in wins]
    for w in bare:  # exactly -20%, as 15.8 against 19.8 was
        w["output_tps"] = 19.8 if w["requests"] == 5 else 15.8
    assert {e.metric for e in detect_series(bare) if e.kind == "collapse"} == {"output_tps"}
    # a real collapse on the same windows is still flagged at its second window
    planted = _ci_windows([5] * 8) + _ci_windows([1, 1, 1])
    for i, w in enumerate(planted):
        w["t_unix"] = T0 + 8.0 * i + 4
    got = [e for e in detect_series(planted) if e.kind == "collapse"]
    assert got and got[0].metric == "output_tps" and got[0].t_unix == planted[9]["t_unix"]


def test_one_failure_among_five_requests_is_not_an_error_collapse() -> None:
    wins = []
    for i in range(12):
        errors = 1 if i in (7, 8) else 0
        wins.append(
            {
                "t_unix": T0 + 60.0 * i,
                "users": 1,
                "error_ratio": errors / 5,
                "requests": 5,
                "count_sd": {"error_ratio": share_sd(errors, 5)},
            }
        )
    assert [e for e in detect_series(wins) if e.kind == "collapse"] == []


def test_the_backlog_counts_what_was_sent_and_has_not_ended() -> None:
    sched = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    ends = [T0 + 1.5, T0 + 2.5]
    assert outstanding(sched, 0.0, 5.0, ends, T0 + 5.0) == 2  # four sent before 5 s, two ended
    assert outstanding(sched, 1.0, 5.0, ends, T0 + 5.0) == 1  # the slice began at 1 s


def test_load_state_draining_and_transition() -> None:
    def w(level: int, out: int, sched: int = 18, late: int = 0) -> dict[str, Any]:
        return {"load_level": level, "outstanding_end": out, "scheduled": sched, "late": late}

    steady = [w(3, 4), w(3, 5)]
    assert load_state(Backlog.of(steady), w(3, 3)) == {
        "draining": False,
        "load_settled": True,
        "backlog_inherited": False,
    }
    assert load_state(Backlog.of(steady), w(3, 3, late=2))["load_settled"] is False  # late sends: the sender queued
    assert load_state(Backlog.of([w(3, 60), w(3, 50)]), w(3, 40)) == {
        "draining": True,
        "load_settled": False,
        "backlog_inherited": False,
    }  # falling 20 in 2 windows
    assert load_state(Backlog.of([w(3, 40), w(3, 60)]), w(3, 80))["load_settled"] is False  # growing
    assert (
        load_state(Backlog.of([w(3, 4), w(5, 4)]), w(5, 4))["load_settled"] is False
    )  # the window after the transition
    assert (
        load_state(Backlog.of([w(3, 40), w(3, 41)]), w(3, 40))["load_settled"] is False
    )  # still, but two windows' arrivals waiting
    assert load_state(Backlog.of([]), w(5, 4))["load_settled"] is False


def test_load_state_the_queue_an_earlier_level_left() -> None:
    def w(level: int | None, out: int, sched: int = 12, **more: Any) -> dict[str, Any]:
        return {"load_level": level, "outstanding_end": out, "scheduled": sched, "late": 0, **more}

    quiet = [w(-17, 1, load_settled=True), w(-17, 4, load_settled=True)]  # 0.2 rps, the queue empty
    heavy = [*quiet, w(-7, 120), w(None, 123)]  # 0.5 rps left 123 waiting; back to 0.2 rps
    first = load_state(Backlog.of(heavy), w(-17, 100))
    assert first["backlog_inherited"] and not first["load_settled"]
    # a window whose fall Poisson arrivals hid: not draining, still the old queue (over 4 settled + 2 sqrt(12) + 1)
    hid = [*heavy, w(-17, 100, backlog_inherited=True)]
    assert load_state(Backlog.of(hid), w(-17, 99)) == {
        "draining": False,
        "load_settled": False,
        "backlog_inherited": True,
    }
    # down to what the level's settled windows held: judged again, and a queue that grows from there is this level's
    # own (a collapse fills the queue)
    down = [*hid, w(-17, 20, backlog_inherited=True)]
    assert not load_state(Backlog.of(down), w(-17, 11))["backlog_inherited"]
    assert not load_state(Backlog.of([*down, w(-17, 11, backlog_inherited=False)]), w(-17, 30))["backlog_inherited"]
    # a level entered with less than one window's arrivals waiting inherits nothing
    assert not load_state(Backlog.of([w(-7, 10), w(None, 10)]), w(-13, 10, sched=18))["backlog_inherited"]


def _staged(seed: int) -> list[dict[str, Any]]:
    """0.2 -> 0.5 -> 0.3 rps, 15, 15 and 25 one-minute windows; the 0.5 level overloads (a backlog of 6 more a minute),
    the 0.3 level first drains it (28 finished, 41-47 t/s), then runs steady (~29 t/s): nothing is wrong."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    history = Backlog()
    backlog = 0
    for i in range(55):
        stage = min(2, i // 15)
        level, rate = [(-17, 0.2), (-7, 0.5), (-13, 0.3)][stage]
        sched = int(rng.poisson(rate * 60))
        if stage == 0:
            done = sched
        elif stage == 1:
            done = min(sched, 24)
        else:
            done = min(backlog + sched, 28)
        backlog = max(0, backlog + sched - done)
        tps = done * 1.6 * (1 + 0.03 * rng.standard_normal())
        win = {
            "t_unix": T0 + 60.0 * i + 30,
            "load_level": level,
            "contaminated": False,
            "scheduled": sched,
            "late": 0,
            "output_tps": tps,
            "requests": done,
            "outstanding_end": backlog + 2,
            "count_sd": {"output_tps": throughput_sd(tps, done, open_loop=True, users=None)},
        }
        win.update(load_state(history, win))
        history.add(win)
        out.append(win)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_level_reference_is_learned_after_the_previous_levels_backlog_drained(seed: int) -> None:
    wins = _staged(seed)
    third = wins[30:]
    assert any(w["draining"] for w in third[:6]), [(w["outstanding_end"], w["requests"]) for w in third]
    det = ChangeDetector()
    events: list[ChangeEvent] = []
    for w in wins:
        events += det.update(w)
    assert [e for e in events if e.kind == "collapse"] == []
    ref = det.state()["output_tps"].reference
    assert (
        det.judged() == (True, None) and ref is not None and 22 < ref < 38
    )  # the steady level (~29), not the drain (43-47)
    # learned from the drain (the rule off): the old false collapse
    blind = [
        {k: v for k, v in w.items() if k not in ("draining", "load_settled", "backlog_inherited", "count_sd")}
        for w in wins
    ]
    assert any(e.kind == "collapse" and e.metric == "output_tps" for e in detect_series(blind))


def test_drift_compares_like_load_with_like() -> None:
    rng = np.random.default_rng(3)
    t = [T0 + 60.0 * i for i in range(120)]
    level = [-17 if i < 60 else -7 for i in range(120)]
    decode = [(40.0 if i < 60 else 16.4) * (1 + 0.03 * rng.standard_normal()) for i in range(120)]  # -59% at the step
    assert trend("decode_tps", t, decode, -1).drifting  # type: ignore[union-attr]  # enough points: not None
    assert not trend("decode_tps", t, decode, -1, levels=level).drifting  # type: ignore[union-attr]  # enough points: not None
    # a decline inside each level is still a drift
    sinking = [d * (1 - 0.25 * i / 120) for i, d in enumerate(decode)]
    tr = trend("decode_tps", t, sinking, -1, levels=level)
    assert tr is not None and tr.drifting and tr.relative_change == pytest.approx(-0.25, abs=0.08)
    # the soak feeds it each window's level, leaves out level changes and unsettled open-loop windows, memory at one level
    wins = [
        {
            "t_unix": x,
            "decode_tps": d,
            "load_level": lv,
            "load_settled": True,
            "engine_memory_mib": 100.0,
            "engine_uptime_s": 900,
        }
        for x, d, lv in zip(t, decode, level, strict=True)
    ]
    wins[5]["load_settled"] = False
    wins[6]["load_level"] = None
    pts = drift_points(wins, "decode_tps")
    assert len(pts) == 118 and {p[2] for p in pts} == {-17, -7}
    assert {p[2] for p in drift_points(wins, "engine_memory_mib")} == {None}


def test_a_request_ran_alone_when_others_were_in_flight_for_under_a_quarter_of_its_time() -> None:
    r = _rec(T0, 0.5, [0.5] * 3)  # T0 .. T0 + 2.0
    own = (T0, T0 + 2.0)

    def alone(*others: tuple[float, float]) -> bool:
        ivs = sorted([own, *others])
        return ran_alone(r, ivs, [a for a, _ in ivs], max(b - a for a, b in ivs))

    assert alone()  # no other request
    assert alone((T0 - 5.0, T0 - 1.0), (T0 + 3.0, T0 + 9.0))  # before and after it, never together
    assert alone((T0 - 5.0, T0 + 0.4))  # 0.4 s of its 2 s shared: under a quarter
    assert not alone((T0 - 5.0, T0 + 0.6))  # 0.6 s shared
    assert not alone((T0 + 1.0, T0 + 1.3), (T0 + 1.5, T0 + 1.8))  # two short ones add up to 0.6 s
    assert not alone((T0 - 60.0, T0 + 60.0))  # a long one that started long before it


def test_an_open_loop_window_gives_the_decode_of_its_requests_that_ran_alone() -> None:
    # two requests alone at 70 t/s, then two together at 35 t/s each; one alone is not enough for a figure
    recs = [
        _rec(T0, 0.5, [0.5] * 3, decode_tps=70.0),
        _rec(T0 + 5.0, 0.5, [0.5] * 3, decode_tps=72.0),
        _rec(T0 + 10.0, 0.5, [0.5] * 6, decode_tps=35.0),
        _rec(T0 + 10.5, 0.5, [0.5] * 6, decode_tps=34.0),
    ]
    intervals = [(r["start_unix_s"], r["start_unix_s"] + r["e2e_s"]) for r in recs]
    fig = window_figures(recs, recs, T0, T0 + 20.0, open_loop=True, users=None, intervals=intervals)
    assert fig["decode_tps"] == pytest.approx(52.5) and fig["alone_requests"] == 2
    assert fig["alone_decode_tps"] == pytest.approx(71.0) and fig["count_sd"]["alone_decode_tps"] is not None
    one = window_figures(recs[1:], recs, T0, T0 + 20.0, open_loop=True, users=None, intervals=intervals)
    assert one["alone_requests"] == 1 and one["alone_decode_tps"] is None
    closed = window_figures(recs, recs, T0, T0 + 20.0, open_loop=False, users=1, intervals=intervals)
    assert "alone_decode_tps" not in closed and "alone_decode_tps" not in closed["count_sd"]


def test_the_backlog_fed_window_by_window_gives_the_states_the_live_soak_wrote() -> None:
    """The third two-hour soak's 120 windows (tests/fixtures/soak_records/alone3_2h, written by the slice when it
    rescanned every earlier window of its slice): fed one at a time into a ``Backlog`` that keeps two windows and a
    maximum per level, each window's draining, settled and inherited states come out as written."""
    windows = [json.loads(line) for line in SOAK3.read_text().splitlines()]
    states = dict.fromkeys(("draining", "load_settled", "backlog_inherited"), 0)
    backlogs: dict[str, Backlog] = {}
    for w in windows:
        backlog = backlogs.setdefault(w["slice"], Backlog())
        got = load_state(backlog, {k: w.get(k) for k in ("load_level", "outstanding_end", "scheduled", "late")})
        assert got == {k: w[k] for k in got}, (w["slice"], w["t_unix"], got)
        states = {k: n + bool(w[k]) for k, n in states.items()}
        backlog.add(w)
        assert len(backlog.recent) <= 2
    assert states["load_settled"] > 30 and states["draining"] + states["backlog_inherited"] > 0, states
