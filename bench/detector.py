"""The soak's collapse detector (harness/changepoint.py) on simulated soaks: how soon it flags a
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
delay is from that instant to the end of the window that decided the collapse: when the soak knows.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.changepoint import WATCHED_CHANGES, ChangeEvent, DetectorSettings, MetricRule, detect_series, memory_forecast
from harness.load.shapes import users_at
from harness.trend import trend

T0_UNIX = 1_700_000_000.0
HOUR_S = 3600.0
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
    for i in range(int(round(dur / ws))):
        a, b = i * ws, (i + 1) * ws
        sub = np.array([users_at(soak.shape, a + (k + 0.5) * ws / SUBSAMPLES, dur) for k in range(SUBSAMPLES)], dtype=float)
        ua, ub = users_at(soak.shape, a, dur), users_at(soak.shape, b - 1e-6, dur)
        after = 0.0 if soak.step_at_s is None else min(1.0, max(0.0, (b - soak.step_at_s) / ws))
        factor = 1.0 - after + after * soak.step_factor
        noise = 1.0 + soak.noise * rng.standard_normal(5)
        requests = int(rng.poisson(float(np.mean(sub**0.8)) * ws * factor))
        w: dict[str, Any] = {
            "t_unix": T0_UNIX + a + ws / 2, "t_start_unix": T0_UNIX + a, "t_end_unix": T0_UNIX + b,
            "users": ua if ua == ub else None, "contaminated": False,
            "output_tps": float(np.mean(100.0 * sub**0.8)) * factor * noise[0],
            "decode_tps": float(np.mean(40.0 * sub**-0.3)) * noise[1],
            "ttft_p95_s": float(np.mean(0.8 * sub**0.5)) * noise[2],
            "acceptance": 0.7 * noise[3],
            "engine_memory_mib": 2000.0 * (1 + 0.15 * min(a, 600.0) / 600.0) * noise[4],
            "error_ratio": rng.binomial(requests, 0.01) / requests if requests else None,
        }
        if soak.dead_after_step and after >= 1.0:
            w.update(decode_tps=None, ttft_p95_s=None, acceptance=None, error_ratio=None)
        if soak.drop_users:
            del w["users"]
        out.append(w)
    return out


def _delay_min(events: list[ChangeEvent], soak: Soak) -> tuple[float | None, int]:
    """Minutes from the step to the end of the window that flagged it, and collapses flagged before the step."""
    assert soak.step_at_s is not None
    t_step = T0_UNIX + soak.step_at_s
    early = [e for e in events if e.kind == "collapse" and e.t_unix + soak.window_s / 2 <= t_step]
    late = [e for e in events if e.kind == "collapse" and e.t_unix + soak.window_s / 2 > t_step]
    return ((late[0].t_unix + soak.window_s / 2 - t_step) / 60.0 if late else None), len(early)


def _trend_delay_min(wins: list[dict[str, Any]], soak: Soak) -> float | None:
    """harness.trend.trend as the soak calls it: on all windows so far, once per new window (from the step on)."""
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


def _fmt(xs: list[float]) -> tuple[str, str]:
    return (f"{np.median(xs):.1f}", f"{max(xs):.1f}") if xs else ("-", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=50, help="seeds per detection row")
    ap.add_argument("--trend-seeds", type=int, default=None, help="seeds for harness.trend on the -30%% step (default: --seeds)")
    ap.add_argument("--alarm-seeds", type=int, default=40, help="seeds per false-alarm row")
    a = ap.parse_args()
    trend_seeds = a.seeds if a.trend_seeds is None else a.trend_seeds
    settings = DetectorSettings()
    t_start = time.perf_counter()
    print(f"$ .venv/bin/python -m bench.detector {' '.join(sys.argv[1:])}".rstrip())
    print(f"settings: {settings}")
    for m, r in WATCHED_CHANGES.items():
        print(f"  {m}: bad {'rises' if r.bad_direction > 0 else 'falls'}, min_change {r.min_change:g}"
              f"{' absolute' if r.absolute else ''}, noise floor {r.noise_floor:g}")

    # ---- detection delay -----------------------------------------------------------------------
    print("\nDetection: 6 h flat (1 user), then output_tps steps at a random instant; minutes from the step to the")
    print("end of the window that flagged it (median, max over seeds); collapses flagged before the step are false alarms.\n")
    print("| step | window s | noise | seeds | median min | max min | missed | false alarms in the 6 h before |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    wide = {m: r if r.absolute else replace(r, min_change=1.5 * r.min_change) for m, r in WATCHED_CHANGES.items()}
    rows: list[tuple[str, float, float, bool, float, dict[str, MetricRule] | None]] = [
        ("-30%", 0.7, 60.0, False, 0.03, None), ("-60%", 0.4, 60.0, False, 0.03, None),
        ("to 2%, no request finishes", 0.02, 60.0, True, 0.03, None), ("-30%", 0.7, 300.0, False, 0.03, None),
        ("-30%", 0.7, 60.0, False, 0.10, None), ("-30%, relative min_change x1.5", 0.7, 60.0, False, 0.10, wide)]
    trend_soaks: list[tuple[Soak, int]] = []
    for label, f, ws, dead, noise, rules in rows:
        delays: list[float] = []
        missed = early_total = 0
        for seed in range(a.seeds):
            rng = np.random.default_rng(10_000 + seed)
            soak = Soak(hours=7.0, window_s=ws, noise=noise, step_at_s=6 * HOUR_S + float(rng.uniform(0, ws)), step_factor=f,
                        dead_after_step=dead)
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
    print(f"| -30%, harness.trend.trend (alpha 0.01, min_change 0.1) for comparison, first {len(trend_soaks)} seeds, 3 h after the step | 60 "
          f"| 3% | {len(trend_soaks)} | {med} | {mx} | {tmissed} | - |")
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
        ("diurnal, users 1..4, 8-h sine", Soak(hours=8.0, shape={"kind": "diurnal", "start_users": 1, "users": 4, "period_s": 8 * HOUR_S}), settings, None),
        ("flat, 1 user", Soak(hours=6.0, noise=0.06), settings, None),
        ("flat, 1 user", Soak(hours=6.0, noise=0.10), settings, None),
        ("flat, 1 user, relative min_change x1.5", Soak(hours=6.0, noise=0.10), settings, wide),
        ("for comparison: flat, reference frozen after its first 5 windows (refine_windows=5)", Soak(hours=6.0, noise=0.06), frozen, None),
        ("for comparison: flat, reference frozen after its first 5 windows (refine_windows=5)", Soak(hours=6.0, noise=0.10), frozen, None),
        ("for comparison: ramp, one reference for all levels (users ignored)", Soak(hours=6.0, shape=ramp, drop_users=True), settings, None),
    ]
    n_fa = a.alarm_seeds
    for label, soak, st, rules in families:
        by_metric: dict[str, int] = {}
        for seed in range(n_fa):
            for e in detect_series(simulate(soak, 20_000 + seed), st, rules):
                if e.kind == "collapse":
                    by_metric[e.metric] = by_metric.get(e.metric, 0) + 1
        detail = ", ".join(f"{m} {n}" for m, n in sorted(by_metric.items())) or "-"
        print(f"| {label} | {soak.noise:.0%} | {n_fa} x {soak.hours:g} | {n_fa * soak.hours:g} | {sum(by_metric.values())} | {detail} |", flush=True)

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
    print("| seeds | slope error median | slope error max | headroom error median | headroom error max | least-squares headroom error max |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {a.seeds} | {np.median(errs_slope):.1%} | {max(errs_slope):.1%} | {np.median(errs_head):.1%} | {max(errs_head):.1%} "
          f"| {max(errs_lsq):.1%} |")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
