"""Open-loop arrivals in a soak, as pure functions of time: the rate curve, the schedule, the window figures.

The Locust pacing user (locustfile.py ``PacingUser``) sends each request at the time ``soak_offsets`` gives it;
the harness (harness/soak.py) computes the same schedule to say what each window was offered. No locust import:
the arithmetic is tested and plotted without gevent.

The schedule is drawn by **time rescaling**: gaps of the scenario's kind (constant, exponential, gamma) at unit
rate, in the curve's own clock ``Λ(t) = ∫₀ᵗ rate`` (the arrivals it asks for by ``t``), mapped back to seconds by
``Λ⁻¹``. A steady rate R is Λ(t) = R·t; stages are piecewise linear and cycle when they end before the soak; a
diurnal curve ``rate(t) = trough + (peak − trough)·(1 − cos 2πt/P)/2`` integrates in closed form. A Poisson
schedule so drawn is an inhomogeneous Poisson process with that rate. The gaps come from one seeded stream in
fixed-size batches, so a slice or a resumed soak gets exactly the arrivals the whole soak would have had there.
Definitions: docs/soak.md#open-loop-arrivals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.arrivals import LATE_AFTER_S, gaps
from harness.servable import meets_slo

__all__ = ["LATE_AFTER_S", "asked_rps", "cumulative", "inverse", "level_of", "rate_at", "soak_offsets", "window_level", "window_traffic",
           "worker_share"]

BATCH = 65_536  # gaps drawn per batch: fixed, so the draws do not depend on how far a slice reaches
_GRID = 4096  # points per diurnal period for the inverse (linear interpolation between them)
LEVEL_STEP = 1.1  # open-loop load levels for the change detector: rates within 10% share a level


def _stages(arrival: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Stage boundaries (seconds, from 0 to the cycle's length) and Λ at each."""
    st = arrival["stages"]
    t = np.concatenate(([0.0], np.cumsum([float(s["duration_s"]) for s in st])))
    lam = np.concatenate(([0.0], np.cumsum([float(s["rate_rps"]) * float(s["duration_s"]) for s in st])))
    return t, lam


def _diurnal(arrival: dict[str, Any], duration_s: float) -> tuple[float, float, float]:
    return float(arrival["trough_rps"]), float(arrival["rate_rps"]), float(arrival.get("period_s") or duration_s)


def rate_at(arrival: dict[str, Any], t: float, duration_s: float) -> float:
    """The rate the curve asks at ``t`` seconds into the soak."""
    if arrival.get("stages"):
        bounds, _ = _stages(arrival)
        x = t % bounds[-1]
        i = min(int(np.searchsorted(bounds, x, side="right")) - 1, len(arrival["stages"]) - 1)
        return float(arrival["stages"][i]["rate_rps"])
    if arrival.get("curve") == "diurnal":
        lo, hi, period = _diurnal(arrival, duration_s)
        return lo + (hi - lo) * (0.5 - 0.5 * math.cos(2 * math.pi * t / period))
    return float(arrival["rate_rps"])


def cumulative(arrival: dict[str, Any], t: float | np.ndarray, duration_s: float) -> Any:
    """Λ(t): the arrivals the curve asks for from the soak's start to ``t`` (a float or an array)."""
    t = np.asarray(t, dtype=float)
    if arrival.get("stages"):
        bounds, lam = _stages(arrival)
        cycles, x = np.divmod(t, bounds[-1])
        out = cycles * lam[-1] + np.interp(x, bounds, lam)
    elif arrival.get("curve") == "diurnal":
        lo, hi, period = _diurnal(arrival, duration_s)
        out = lo * t + (hi - lo) * (t / 2 - period / (4 * math.pi) * np.sin(2 * math.pi * t / period))
    else:
        out = float(arrival["rate_rps"]) * t
    return float(out) if out.ndim == 0 else out


def inverse(arrival: dict[str, Any], lam: np.ndarray, duration_s: float) -> np.ndarray:
    """Λ⁻¹: the seconds at which the curve has asked for ``lam`` arrivals (``lam`` ascending, >= 0)."""
    lam = np.asarray(lam, dtype=float)
    if arrival.get("stages"):
        bounds, cum = _stages(arrival)
        cycles, x = np.divmod(lam, cum[-1])
        return cycles * bounds[-1] + np.interp(x, cum, bounds)
    if arrival.get("curve") == "diurnal":
        _, _, period = _diurnal(arrival, duration_s)
        grid = np.linspace(0.0, period, _GRID + 1)
        cum = cumulative(arrival, grid, duration_s)
        cycles, x = np.divmod(lam, cum[-1])
        return cycles * period + np.interp(x, cum, grid)
    return lam / float(arrival["rate_rps"])


def soak_offsets(arrival: dict[str, Any], start_s: float, end_s: float, duration_s: float) -> np.ndarray:
    """The scheduled send times (seconds from the soak's start) in ``[start_s, end_s)``: the first arrival of the soak
    at 0, each next one a unit-rate gap later in the curve's clock. The same seed gives the same arrivals, whatever
    the slice."""
    kind, cv = arrival.get("kind", "poisson"), arrival.get("cv")
    rng = np.random.default_rng([int(arrival.get("seed", 0)) & 0xFFFFFFFF, 0x50AC])
    lam_start, lam_end = cumulative(arrival, start_s, duration_s), cumulative(arrival, end_s, duration_s)
    parts: list[np.ndarray] = []
    reached = 0.0  # Λ of the next arrival
    while reached < lam_end:
        g = gaps(kind, 1.0, BATCH, rng, cv)
        taus = reached + np.concatenate(([0.0], np.cumsum(g[:-1])))
        reached = float(taus[-1] + g[-1])
        keep = taus[(taus >= lam_start) & (taus < lam_end)]
        if len(keep):
            parts.append(keep)
    if not parts:
        return np.zeros(0)
    t = inverse(arrival, np.concatenate(parts), duration_s)
    return t[(t >= start_s) & (t < end_s)]


def worker_share(n: int, index: int, total: int) -> np.ndarray:
    """Which of ``n`` arrivals a Locust worker sends: every ``total``-th, from its ``index``."""
    return np.arange(index, n, max(1, total))


def in_flight_share(max_in_flight: int, index: int, total: int) -> int:
    """A worker's part of ``max_in_flight`` (the parts add up to it; at least 1 each)."""
    total = max(1, total)
    return max(1, max_in_flight // total + (1 if index < max_in_flight % total else 0))


def asked_rps(arrival: dict[str, Any], t0: float, t1: float, duration_s: float) -> float | None:
    """The mean rate the curve asks over ``[t0, t1)`` (soak seconds)."""
    if t1 <= t0:
        return None
    return (cumulative(arrival, t1, duration_s) - cumulative(arrival, t0, duration_s)) / (t1 - t0)


def level_of(rate_rps: float) -> int:
    """The change detector's load level of a rate: rates within LEVEL_STEP of each other share one."""
    return int(round(math.log(rate_rps) / math.log(LEVEL_STEP))) if rate_rps > 0 else -(10**6)


def window_level(arrival: dict[str, Any], t0: float, t1: float, duration_s: float) -> int | None:
    """A window's load level (see ``level_of``), or None when the curve crossed into another level inside it (a
    stage changed, or a diurnal rate moved past 10%): the change detector does not judge such a window."""
    a, b = level_of(rate_at(arrival, t0, duration_s)), level_of(rate_at(arrival, max(t0, t1 - 1e-6), duration_s))
    if a != b:
        return None
    if arrival.get("stages"):
        bounds, _ = _stages(arrival)  # a stage shorter than the window may lie inside it
        first = math.floor(t0 / bounds[-1]) * bounds[-1]
        for k in range(int(math.ceil((t1 - first) / bounds[-1])) + 1):
            for x in first + k * bounds[-1] + bounds[:-1]:
                if t0 < x < t1 and level_of(rate_at(arrival, float(x), duration_s)) != a:
                    return None
    return a


def window_traffic(recs: list[dict[str, Any]], seconds: float, slo: tuple[float | None, float | None, float | None],
                   arrival: dict[str, Any] | None = None, schedule: np.ndarray | None = None,
                   span_s: tuple[float, float] | None = None, duration_s: float = 0.0) -> dict[str, Any]:
    """A soak window's traffic figures (docs/soak.md#open-loop-arrivals), from the requests that finished in it:

    - ``achieved_rps``: successful requests / the window's seconds; ``slo_met``: how many met the SLO (``slo``: per-token
      t/s min, TTFT max, end-to-end max; harness/servable.py ``meets_slo``, timed from the scheduled send), and
      ``goodput_rps`` = that / seconds; both None when the SLO sets no per-request bound;
    - open loop (``arrival``, with the slice's ``schedule`` and the window's ``span_s`` in soak seconds): ``asked_rps``
      (the curve's mean rate over the span), ``scheduled`` (arrivals the schedule put in the span) and ``offered_rps``
      (those / the span's seconds), ``late`` (late sends among the window's requests), ``max_send_delay_s``, and ``load_level``
      (the change detector's level; None when the rate crossed levels inside the window).
    """
    ok = sum(1 for r in recs if r.get("status") == "ok")
    met = (sum(1 for r in recs if meets_slo(r.get("status") or "", r.get("ttft_s"), r.get("decode_tps"), r.get("e2e_s"),
                                            r.get("send_delay_s"), *slo))
           if any(b is not None for b in slo) else None)
    out: dict[str, Any] = {
        "achieved_rps": ok / seconds if seconds > 0 else None,
        "slo_met": met,
        "goodput_rps": met / seconds if met is not None and seconds > 0 else None,
    }
    if arrival is None or schedule is None or span_s is None:
        return out
    s0, s1 = span_s
    delays = [float(r["send_delay_s"]) for r in recs if r.get("send_delay_s") is not None]
    scheduled = int(np.count_nonzero((schedule >= s0) & (schedule < s1)))
    asks = s1 > s0  # an empty span (the drain after the slice's schedule ended) asks and offers nothing
    out.update({
        "soak_t_start_s": s0, "soak_t_end_s": max(s0, s1),
        "asked_rps": asked_rps(arrival, s0, s1, duration_s) if asks else None,
        "scheduled": scheduled,
        "offered_rps": scheduled / (s1 - s0) if asks else None,
        "late": sum(1 for r in recs if r.get("late")),
        "max_send_delay_s": max(delays) if delays else None,
        "load_level": window_level(arrival, s0, s1, duration_s) if asks else None,
    })
    return out
