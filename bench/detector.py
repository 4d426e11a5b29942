"""The soak's collapse detector (harness/detect/changepoint.py) on simulated soaks: how soon it flags a
collapse, and how often it flags one that is not there.

    .venv/bin/python -m bench.detector            # the figures in docs/detector.md (~30 s on one core)
    .venv/bin/python -m bench.detector --seeds 10 --alarm-seeds 5  # a quicker look

Windows are simulated, 60 s each unless a row says otherwise, with multiplicative Gaussian noise on
every metric (3% unless a row says otherwise) and fixed seeds. One configuration, so the model is:

- output_tps = 100 x users^0.8, decode_tps = 40 x users^-0.3, ttft_p95_s = 0.8 x users^0.5,
  acceptance = 0.7: the load changes, nothing degrades;
- engine_memory_mib = 2000 MiB growing +15% over the first 10 minutes (warm-up), then flat;
- error_ratio: Poisson(1 request/s x users^0.8) requests a window, each failing with p = 1% (binomial
  noise: a multiplicative noise on a reference of ~0 would be no noise at all);
- users per window from harness/load/shapes.py (the soak's own shapes); a window in which the level
  changes has users None (mixed values), as the soak writes it.

A step starts at a random instant inside a window (so the first window of a step is a mix), and the
delay is from that instant to when the soak judges the window that decided the collapse: SETTLE_WINDOWS
(one) window after its end, once the requests that streamed in it have ended.

Two soaks are simulated request by request instead, their windows built as the soak builds them
(harness/soak/windows.py; "before": as the soak built them up to 964d5c6, throughput from finished requests, no
count sd, no backlog rule, drift over all windows):

- the staged open-loop soak: Poisson 0.2 -> 0.5 -> 0.3 rps, 15 min each, 60-s windows, 128-token answers on
  an engine of 2 slots at 28 t/s each (0.41 rps at most): the 0.5 level overloads it (max_in_flight 16, then
  late sends), the 0.3 level drains the backlog, then runs steady; nothing planted;
- the quantised closed-loop soak of tests/integration/test_soak_gauntlet.py (its collapse plant): one user, 32-token answers
  (TTFT ~1.1 s, 70 t/s), 8-s windows of 4 or 5 finished requests, 2 minutes, the test's detector settings;
  unplanted, and planted (from 45 s the engine runs 15% of the time, as the test's SIGSTOP duty cycle).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.config.schema import Watchdog
from harness.detect.changepoint import (
    WATCHED_CHANGES,
    ChangeEvent,
    DetectorSettings,
    MetricRule,
    detect_series,
    memory_forecast,
)
from harness.detect.trend import WATCHED, trend
from harness.load.pacing import window_traffic
from harness.load.schedule import LATE_AFTER_S, soak_offsets
from harness.load.shapes import users_at
from harness.soak.slice import SETTLE_WINDOWS
from harness.soak.watchdog import drift_points
from harness.soak.windows import Backlog, end_unix, load_state, outstanding, throughput_sd, window_figures

T0_UNIX = 1_700_000_000.0
HOUR_S = 3600.0
DRIFT_MIN_SPAN_S = Watchdog().drift_min_span_s  # today's soak runs the trend test only over this span
SUBSAMPLES = 6  # per window, to average the load over a window in which it changes


@dataclass(frozen=True)
class Soak:
    hours: float
    window_s: float = 60.0
    noise: float = 0.03
    shape: dict[str, Any] = field(default_factory=lambda: {"kind": "steady", "users": 1})
    step_at_s: float | None = None  # output_tps becomes step_factor x itself from this offset on
    step_factor: float = 1.0
    dead_after_step: bool = False  # no request finishes after the step: decode, TTFT, acceptance, errors None
    drop_users: bool = False  # windows without a "users" key: one reference for all levels (for comparison)


def simulate(soak: Soak, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    ws, dur = soak.window_s, soak.hours * HOUR_S
    out: list[dict[str, Any]] = []
    for i in range(round(dur / ws)):
        a, b = i * ws, (i + 1) * ws
        sub = np.array(
            [users_at(soak.shape, a + (k + 0.5) * ws / SUBSAMPLES, dur) for k in range(SUBSAMPLES)], dtype=float
        )
        ua, ub = users_at(soak.shape, a, dur), users_at(soak.shape, b - 1e-6, dur)
        after = 0.0 if soak.step_at_s is None else min(1.0, max(0.0, (b - soak.step_at_s) / ws))
        factor = 1.0 - after + after * soak.step_factor
        noise = 1.0 + soak.noise * rng.standard_normal(5)
        requests = int(rng.poisson(float(np.mean(sub**0.8)) * ws * factor))
        w: dict[str, Any] = {
            "t_unix": T0_UNIX + a + ws / 2,
            "t_start_unix": T0_UNIX + a,
            "t_end_unix": T0_UNIX + b,
            "users": ua if ua == ub else None,
            "contaminated": False,
            "output_tps": float(np.mean(100.0 * sub**0.8)) * factor * noise[0],
            "decode_tps": float(np.mean(40.0 * sub**-0.3)) * noise[1],
            "ttft_p95_s": float(np.mean(0.8 * sub**0.5)) * noise[2],
            "acceptance": 0.7 * noise[3],
            "engine_memory_mib": 2000.0 * (1 + 0.15 * min(a, 600.0) / 600.0) * noise[4],
            "error_ratio": rng.binomial(requests, 0.01) / requests if requests else None,
        }
        w["count_sd"] = {"output_tps": throughput_sd(w["output_tps"], requests, open_loop=False, users=ua)}
        if soak.dead_after_step and after >= 1.0:
            w.update(decode_tps=None, ttft_p95_s=None, acceptance=None, error_ratio=None)
        if soak.drop_users:
            del w["users"]
        out.append(w)
    return out


def _delay_min(events: list[ChangeEvent], soak: Soak) -> tuple[float | None, int]:
    """Minutes from the step to when the soak judges the window that flagged it (SETTLE_WINDOWS after its end), and
    collapses flagged before the step."""
    assert soak.step_at_s is not None
    t_step = T0_UNIX + soak.step_at_s
    early = [e for e in events if e.kind == "collapse" and e.t_unix + soak.window_s / 2 <= t_step]
    late = [e for e in events if e.kind == "collapse" and e.t_unix + soak.window_s / 2 > t_step]
    return (
        (late[0].t_unix + soak.window_s / 2 + SETTLE_WINDOWS * soak.window_s - t_step) / 60.0 if late else None
    ), len(early)


def _trend_delay_min(wins: list[dict[str, Any]], soak: Soak) -> float | None:
    """harness.detect.trend.trend as the soak calls it: on all windows so far, once per new window (from the step on)."""
    assert soak.step_at_s is not None
    t_step = T0_UNIX + soak.step_at_s
    t = [w["t_unix"] for w in wins]
    y = [w["output_tps"] for w in wins]
    for j, w in enumerate(wins):
        if w["t_end_unix"] <= t_step:
            continue
        tr = trend("output_tps", t[: j + 1], y[: j + 1], -1, alpha=0.01, min_change=0.1)
        if tr is not None and tr.drifting:
            return float(w["t_end_unix"] - t_step) / 60.0
    return None


def _request(
    start: float, send_delay: float, prefill_s: float, tokens: int, speed_tps: float, scheduled: float | None
) -> dict[str, Any]:
    """A request record as the Locust user writes it: sent at ``start``, streamed one token a chunk."""
    gap = 1.0 / speed_tps
    return {
        "status": "ok",
        "start_unix_s": start,
        "ttft_s": prefill_s,
        "itl_s": [gap] * (tokens - 1),
        "chunk_tokens": [1] * tokens,
        "output_tokens": tokens,
        "e2e_s": prefill_s + (tokens - 1) * gap,
        "decode_tps": speed_tps,
        "scheduled_unix_s": scheduled,
        "send_delay_s": send_delay,
        "late": send_delay > LATE_AFTER_S if scheduled is not None else None,
    }


STAGED = {
    "kind": "poisson",
    "stages": [
        {"rate_rps": 0.2, "duration_s": 900.0},
        {"rate_rps": 0.5, "duration_s": 900.0},
        {"rate_rps": 0.3, "duration_s": 900.0},
    ],
    "max_in_flight": 16,
}


def staged_records(seed: int, slow_from_s: float | None = None) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The staged open-loop soak's requests: 2 slots, FIFO, 28 t/s per slot (5% noise), 0.3 s prefill, 128 tokens;
    from ``slow_from_s`` the engine runs 15% of the time (28 x 0.15 t/s a slot)."""
    rng = np.random.default_rng(seed)
    sched = soak_offsets({**STAGED, "seed": seed}, 0.0, 2700.0, 2700.0)
    slots = [0.0, 0.0]
    finishes: list[float] = []
    recs = []
    for i, a in enumerate(sched):
        send = max(a, finishes[i - 16]) if i >= 16 else a  # max_in_flight 16 (FIFO: the 16th before has ended first)
        k = int(np.argmin(slots))
        begin = max(send, slots[k])
        speed = (
            28.0
            * (1 + 0.05 * rng.standard_normal())
            * (0.15 if slow_from_s is not None and begin >= slow_from_s else 1.0)
        )
        r = _request(T0_UNIX + send, send - a, begin - send + 0.3, 128, speed, T0_UNIX + a)
        finishes.append(end_unix(r) - T0_UNIX)
        slots[k] = finishes[-1]
        recs.append(r)
    return recs, sched


def _bounds(n: int, ws: float, seed: int | None = None) -> list[tuple[float, float]]:
    """n back-to-back windows of ``ws`` seconds; with a seed, each closes 20-120 ms late (the soak closes a window at a
    probe past ``window_s``: the CI soak's were 8.05-8.1 s)."""
    rng = np.random.default_rng(seed) if seed is not None else None
    out, t = [], T0_UNIX
    for _ in range(n):
        t1 = t + ws + (float(rng.uniform(0.02, 0.12)) if rng is not None else 0.0)
        out.append((t, t1))
        t = t1
    return out


def _windows_from(
    recs: list[dict[str, Any]],
    bounds: list[tuple[float, float]],
    new: bool,
    users: int | None = None,
    arrival: dict[str, Any] | None = None,
    sched: np.ndarray | None = None,
    duration_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Windows as the soak writes them: ``new`` (harness/soak/windows.py) or as before (finished requests, no count sd or backlog)."""
    ends = sorted(end_unix(r) for r in recs)
    out: list[dict[str, Any]] = []
    backlog = Backlog()
    for t0, t1 in bounds:
        ws = t1 - t0
        ended = [r for r in recs if t0 <= end_unix(r) < t1]
        w: dict[str, Any] = {
            "config": "sim",
            "t_start_unix": t0,
            "t_end_unix": t1,
            "t_unix": t0 + ws / 2,
            "contaminated": False,
        }
        if arrival is None:
            w["users"] = users
        else:
            assert sched is not None
            s0, s1 = t0 - T0_UNIX, t1 - T0_UNIX
            w.update(window_traffic(ended, ws, (None, None, None), arrival, sched, (s0, s1), duration_s))
        if new:
            w.update(
                window_figures(
                    ended,
                    [r for r in recs if r["start_unix_s"] < t1 and end_unix(r) >= t0],
                    t0,
                    t1,
                    arrival is not None,
                    users,
                )
            )
            if arrival is not None and sched is not None:
                w["outstanding_end"] = outstanding(sched, 0.0, t1 - T0_UNIX, ends, t1)
                w.update(load_state(backlog, w))
        else:
            ok = [r for r in ended if r["status"] == "ok"]
            decode = [r["decode_tps"] for r in ok]
            ttft = [r["ttft_s"] for r in ok]
            w.update(
                {
                    "requests": len(ended),
                    "output_tps": sum(r["output_tokens"] for r in ok) / ws,
                    "decode_tps": float(np.median(decode)) if decode else None,
                    "ttft_p95_s": float(np.percentile(ttft, 95)) if ttft else None,
                    "error_ratio": 0.0 if ended else None,
                }
            )
        backlog.add(w)
        out.append(w)
    return out


def _verdicts(
    wins: list[dict[str, Any]], settings: DetectorSettings, new: bool, drift_min_change: float = 0.1
) -> list[str]:
    """Collapse events and drift verdicts, as the soak gives them (the drift test after every window, once per metric;
    ``new``: once its windows span ``drift_min_span_s``)."""
    got = [f"collapse {e.metric}" for e in detect_series(wins, settings) if e.kind == "collapse"]
    flagged: set[str] = set()
    for j in range(6, len(wins) + 1):
        for metric, bad in WATCHED.items():
            if metric in flagged or metric == "engine_memory_mib":
                continue
            pts = (
                drift_points(wins[:j], metric)
                if new
                else [(w["t_unix"], w[metric], None) for w in wins[:j] if w.get(metric) is not None]
            )
            if len(pts) < 6 or (new and pts[-1][0] - pts[0][0] < DRIFT_MIN_SPAN_S):
                continue
            tr = trend(
                metric, [p[0] for p in pts], [p[1] for p in pts], bad, 0.01, drift_min_change, [p[2] for p in pts]
            )
            if tr is not None and tr.drifting:
                flagged.add(metric)
                got.append(f"drift {metric}")
    return got


def closed_loop_records(
    seed: int, seconds: float, speed: float = 1.0, slow_from_s: float | None = None
) -> list[dict[str, Any]]:
    """One closed-loop user, 32-token answers on a machine ``speed`` times the CI VM's: TTFT ~1.2 s, 70 t/s (3% noise
    each), 50 ms between requests, the machine's speed swinging +-8% over two minutes (CI saw -12% within one soak);
    from ``slow_from_s`` the engine runs 15% of the time (every duration x 1/0.15)."""
    rng = np.random.default_rng(seed)
    phase = float(rng.uniform(0, 2 * np.pi))
    out, t = [], 0.0
    while t < seconds:
        slow = 1 / 0.15 if slow_from_s is not None and t >= slow_from_s else 1.0
        sp = speed * (1 + 0.08 * np.sin(2 * np.pi * t / 120.0 + phase))
        r = _request(
            T0_UNIX + t,
            0.0,
            1.2 * (1 + 0.03 * rng.standard_normal()) * slow / sp,
            32,
            70.0 * (1 + 0.03 * rng.standard_normal()) * sp / slow,
            None,
        )
        out.append(r)
        t = end_unix(r) - T0_UNIX + 0.05
    return out


def _fmt(xs: list[float]) -> tuple[str, str]:
    return (f"{np.median(xs):.1f}", f"{max(xs):.1f}") if xs else ("-", "-")


def _planted_row(speed: float, n: int, ci: DetectorSettings) -> None:
    """The planted CI soak at one machine speed: seconds from the onset to the verdict, before and after (judged)."""
    res: dict[bool, list[float]] = {False: [], True: []}
    miss = {False: 0, True: 0}
    for seed in range(n):
        onset = 45.0 + float(np.random.default_rng(60_000 + seed).uniform(0, 8.0))
        recs = closed_loop_records(60_000 + seed, 140.0, speed, slow_from_s=onset)
        bounds = _bounds(15, 8.0, 60_000 + seed)
        for new in (False, True):
            wins = _windows_from(recs, bounds, new, users=1)
            ev = [e for e in detect_series(wins, ci) if e.kind == "collapse"]
            if not ev or ev[0].t_unix < T0_UNIX + onset - 8.5:
                miss[new] += 1
                continue
            i = next(k for k, w in enumerate(wins) if w["t_unix"] == ev[0].t_unix)
            seen = (
                wins[min(i + 1, len(wins) - 1)]["t_end_unix"] if new else wins[i]["t_end_unix"]
            )  # the soak judges it a window later
            res[new].append(seen - (T0_UNIX + onset))
    print(
        f"| x{speed:g} | {n} | {_fmt(res[False])[0]} | {_fmt(res[False])[1]} | {miss[False]} | {_fmt(res[True])[0]} | {_fmt(res[True])[1]} "
        f"| {miss[True]} |",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=50, help="seeds per detection row")
    ap.add_argument(
        "--trend-seeds",
        type=int,
        default=None,
        help="seeds for harness.detect.trend on the -30%% step (default: --seeds)",
    )
    ap.add_argument("--alarm-seeds", type=int, default=40, help="seeds per false-alarm row")
    a = ap.parse_args()
    trend_seeds = a.seeds if a.trend_seeds is None else a.trend_seeds
    settings = DetectorSettings()
    t_start = time.perf_counter()
    print(f"$ .venv/bin/python -m bench.detector {' '.join(sys.argv[1:])}".rstrip())
    print(f"settings: {settings}")
    for m, r in WATCHED_CHANGES.items():
        print(
            f"  {m}: bad {'rises' if r.bad_direction > 0 else 'falls'}, min_change {r.min_change:g}"
            f"{' absolute' if r.absolute else ''}, noise floor {r.noise_floor:g}"
        )

    # ---- detection delay -----------------------------------------------------------------------
    print(
        "\nDetection: 6 h flat (1 user), then output_tps steps at a random instant; minutes from the step to when the soak"
    )
    print(
        "judges the window that flagged it, one window after its end (median, max over seeds); collapses flagged before"
    )
    print("the step are false alarms.\n")
    print("| step | window s | noise | seeds | median min | max min | missed | false alarms in the 6 h before |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    wide = {m: r if r.absolute else replace(r, min_change=1.5 * r.min_change) for m, r in WATCHED_CHANGES.items()}
    rows: list[tuple[str, float, float, bool, float, dict[str, MetricRule] | None]] = [
        ("-30%", 0.7, 60.0, False, 0.03, None),
        ("-60%", 0.4, 60.0, False, 0.03, None),
        ("to 2%, no request finishes", 0.02, 60.0, True, 0.03, None),
        ("-30%", 0.7, 300.0, False, 0.03, None),
        ("-30%", 0.7, 60.0, False, 0.10, None),
        ("-30%, relative min_change x1.5", 0.7, 60.0, False, 0.10, wide),
    ]
    trend_soaks: list[tuple[Soak, int]] = []
    for label, f, ws, dead, noise, rules in rows:
        delays: list[float] = []
        missed = early_total = 0
        for seed in range(a.seeds):
            rng = np.random.default_rng(10_000 + seed)
            soak = Soak(
                hours=7.0,
                window_s=ws,
                noise=noise,
                step_at_s=6 * HOUR_S + float(rng.uniform(0, ws)),
                step_factor=f,
                dead_after_step=dead,
            )
            d, early = _delay_min(detect_series(simulate(soak, seed), settings, rules), soak)
            early_total += early
            if d is None:
                missed += 1
            else:
                delays.append(d)
            if label == "-30%" and ws == 60.0 and noise == 0.03 and seed < trend_seeds:
                trend_soaks.append((soak, seed))
        med, mx = _fmt(delays)
        print(f"| {label} | {ws:.0f} | {noise:.0%} | {a.seeds} | {med} | {mx} | {missed} | {early_total} |", flush=True)

    t_trend = time.perf_counter()
    tdelays: list[float] = []
    tmissed = 0
    for soak, seed in trend_soaks:
        longer = Soak(hours=9.0, window_s=soak.window_s, step_at_s=soak.step_at_s, step_factor=soak.step_factor)
        d = _trend_delay_min(simulate(longer, seed), longer)
        if d is None:
            tmissed += 1
        else:
            tdelays.append(d)
    med, mx = _fmt(tdelays)
    print(
        f"| -30%, harness.detect.trend.trend (alpha 0.01, min_change 0.1) for comparison, first {len(trend_soaks)} seeds, 3 h after the step | 60 "
        f"| 3% | {len(trend_soaks)} | {med} | {mx} | {tmissed} | - |"
    )
    print(f"\n(trend rows: {time.perf_counter() - t_trend:.0f} s; it refits all windows so far at every window)")

    # ---- false alarms --------------------------------------------------------------------------
    print("\nFalse alarms: no degradation at all; collapse events counted over all six metrics.\n")
    print("| family | noise | seeds x hours | window-hours | collapse events | by metric |")
    print("|---|---:|---:|---:|---:|---|")
    ramp = {"kind": "ramp", "start_users": 1, "users": 8}
    frozen = replace(settings, refine_windows=settings.reference_windows)
    families: list[tuple[str, Soak, DetectorSettings, dict[str, MetricRule] | None]] = [
        ("flat, 1 user", Soak(hours=6.0), settings, None),
        ("ramp, users 1 -> 8 over the soak", Soak(hours=6.0, shape=ramp), settings, None),
        (
            "diurnal, users 1..4, 8-h sine",
            Soak(hours=8.0, shape={"kind": "diurnal", "start_users": 1, "users": 4, "period_s": 8 * HOUR_S}),
            settings,
            None,
        ),
        ("flat, 1 user", Soak(hours=6.0, noise=0.06), settings, None),
        ("flat, 1 user", Soak(hours=6.0, noise=0.10), settings, None),
        ("flat, 1 user, relative min_change x1.5", Soak(hours=6.0, noise=0.10), settings, wide),
        (
            "for comparison: flat, reference frozen after its first 5 windows (refine_windows=5)",
            Soak(hours=6.0, noise=0.06),
            frozen,
            None,
        ),
        (
            "for comparison: flat, reference frozen after its first 5 windows (refine_windows=5)",
            Soak(hours=6.0, noise=0.10),
            frozen,
            None,
        ),
        (
            "for comparison: ramp, one reference for all levels (users ignored)",
            Soak(hours=6.0, shape=ramp, drop_users=True),
            settings,
            None,
        ),
    ]
    n_fa = a.alarm_seeds
    for label, soak, st, rules in families:
        by_metric: dict[str, int] = {}
        for seed in range(n_fa):
            for e in detect_series(simulate(soak, 20_000 + seed), st, rules):
                if e.kind == "collapse":
                    by_metric[e.metric] = by_metric.get(e.metric, 0) + 1
        detail = ", ".join(f"{m} {n}" for m, n in sorted(by_metric.items())) or "-"
        print(
            f"| {label} | {soak.noise:.0%} | {n_fa} x {soak.hours:g} | {n_fa * soak.hours:g} | {sum(by_metric.values())} | {detail} |",
            flush=True,
        )

    # ---- soaks simulated request by request -------------------------------------------------------
    print("\nSoaks simulated request by request (windows as the soak builds them; before: as up to 964d5c6).\n")
    print("| soak | windows | seeds | false verdicts before | after | before, by kind | after, by kind |")
    print("|---|---|---:|---:|---:|---|---|")
    staged_rows: list[tuple[str, list[str], list[str]]] = []
    n_staged = max(1, a.alarm_seeds // 2)
    for seed in range(n_staged):
        recs, sched = staged_records(40_000 + seed)
        bounds = _bounds(45, 60.0)
        arrival = {**STAGED, "seed": 40_000 + seed}
        before = _verdicts(
            _windows_from(recs, bounds, False, arrival=arrival, sched=sched, duration_s=2700.0), settings, False
        )
        after = _verdicts(
            _windows_from(recs, bounds, True, arrival=arrival, sched=sched, duration_s=2700.0), settings, True
        )
        staged_rows.append(("staged", before, after))
    delays: list[float] = []
    missed = 0
    for seed in range(n_staged):
        onset = 600.0 + float(np.random.default_rng(70_000 + seed).uniform(0, 60.0))
        recs, sched = staged_records(40_000 + seed, slow_from_s=onset)
        wins = _windows_from(
            recs, _bounds(45, 60.0), True, arrival={**STAGED, "seed": 40_000 + seed}, sched=sched, duration_s=2700.0
        )
        ev = [e for e in detect_series(wins, settings) if e.kind == "collapse"]
        if not ev or ev[0].t_unix < T0_UNIX + onset - 60.0:
            missed += 1
            continue
        delays.append((ev[0].t_unix + 30.0 + 60.0 * SETTLE_WINDOWS - (T0_UNIX + onset)) / 60.0)
    staged_planted = (
        f"\nThe staged soak planted (from minute 10-11, at 0.2 rps, the engine runs 15% of the time), {n_staged} seeds: "
        f"judged {_fmt(delays)[0]} min after the onset (median), {_fmt(delays)[1]} at most, missed {missed}."
    )
    ci = DetectorSettings(warmup_windows=1, reference_windows=3, confirm_windows=2)
    n_closed = 5 * a.alarm_seeds
    speeds = (0.5, 1.0, 2.0)
    closed_rows: dict[float, list[tuple[str, list[str], list[str]]]] = {sp: [] for sp in speeds}
    for sp in speeds:
        for seed in range(n_closed):
            recs = closed_loop_records(50_000 + seed, 140.0, sp)
            bounds = _bounds(15, 8.0, 50_000 + seed)
            before = _verdicts(_windows_from(recs, bounds, False, users=1), ci, False, 0.25)
            after = _verdicts(_windows_from(recs, bounds, True, users=1), ci, True, 0.25)
            closed_rows[sp].append(("closed", before, after))
    table = [("staged open loop 0.2 -> 0.5 -> 0.3 rps, 45 min, unplanted", staged_rows, "60 s", n_staged)]
    table += [
        (
            f"one closed-loop user, 32-token answers, 2 min, unplanted (the CI soak), machine x{sp:g}",
            closed_rows[sp],
            "8 s",
            n_closed,
        )
        for sp in speeds
    ]
    for label, rows_, wins_label, n in table:
        b = [v for _, bb, _ in rows_ for v in bb]
        f = [v for _, _, ff in rows_ for v in ff]

        def kinds(vs: list[str]) -> str:
            return ", ".join(f"{k} {vs.count(k)}" for k in sorted(set(vs))) or "-"

        print(f"| {label} | {wins_label} | {n} | {len(b)} | {len(f)} | {kinds(b)} | {kinds(f)} |", flush=True)
    print(staged_planted)
    print(
        "\nThe planted collapse of the CI soak (from 45 s the engine runs 15% of the time): seconds from the onset to the"
    )
    print(
        "end of the window that flagged it, and, after, when the soak judges it (one window later: SETTLE_WINDOWS).\n"
    )
    print(
        "| machine | seeds | before median s | before max s | missed | after median s (judged) | after max s | missed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for sp in speeds:
        _planted_row(sp, n_closed, ci)

    # ---- memory headroom -----------------------------------------------------------------------
    print("\nMemory headroom: a leak of 120 MiB/h, RSS sampled once a minute with 5 MiB noise and a 300 MiB spike")
    print("every 10th series, 600 MiB available; memory_forecast over the last 30 minutes (true headroom 5.0 h).\n")
    errs_slope: list[float] = []
    errs_head: list[float] = []
    errs_lsq: list[float] = []  # least squares, as Prometheus's predict_linear fits
    for seed in range(a.seeds):
        rng = np.random.default_rng(30_000 + seed)
        t = [T0_UNIX + 60.0 * i for i in range(31)]
        rss = [3000.0 + 120.0 * (ti - T0_UNIX) / HOUR_S + float(rng.normal(0, 5.0)) for ti in t]
        if seed % 10 == 0:
            rss[int(rng.integers(0, 31))] += 300.0
        fc = memory_forecast(t, rss, available_mib=600.0)
        assert fc is not None and fc.headroom_s is not None
        errs_slope.append(abs(fc.slope_mib_per_h / 120.0 - 1))
        errs_head.append(abs(fc.headroom_s / (5 * HOUR_S) - 1))
        lsq = float(np.polyfit((np.asarray(t) - T0_UNIX) / HOUR_S, rss, 1)[0])
        errs_lsq.append(abs(600.0 / lsq / 5.0 - 1) if lsq > 0 else float("inf"))
    print(
        "| seeds | slope error median | slope error max | headroom error median | headroom error max | least-squares headroom error max |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {a.seeds} | {np.median(errs_slope):.1%} | {max(errs_slope):.1%} | {np.median(errs_head):.1%} | {max(errs_head):.1%} "
        f"| {max(errs_lsq):.1%} |"
    )
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
