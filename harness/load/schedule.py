"""Open-loop schedules as pure, seeded arithmetic: when each request of a phase or a soak is due.

A phase's schedule is drawn first (``schedule``) and sent by harness/load/arrivals.py whatever the answers; a soak's
comes from its rate curve by **time rescaling**: gaps of the scenario's kind (constant, exponential, gamma) at unit
rate, in the curve's own clock ``Λ(t) = ∫₀ᵗ rate`` (the arrivals it asks for by ``t``), mapped back to seconds by
``Λ⁻¹``. A steady rate R is Λ(t) = R·t; stages are piecewise linear and cycle when they end before the soak; a
diurnal curve ``rate(t) = trough + (peak − trough)·(1 − cos 2πt/P)/2`` integrates in closed form. A Poisson
schedule so drawn is an inhomogeneous Poisson process with that rate. The gaps come from one seeded stream in
fixed-size batches, so a slice or a resumed soak gets exactly the arrivals the whole soak would have had there.

A leaf: numpy only, so the scenario's checks (harness/config) can use it below the load layer. Definitions:
docs/soak.md#open-loop-arrivals, docs/metrics.md#open-loop-phases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from harness.config.schema import Arrival, ArrivalKind, Stage


# A request sent this much after its scheduled time is late even with a slot free: the client itself
# (its event loop, a busy CPU) could not keep the schedule.
LATE_AFTER_S = 0.010


@dataclass(frozen=True)
class Schedule:
    """Send times of one phase, in seconds from its start (ascending, the first at 0 or at its stage's start),
    and the span they were drawn over: ``offered_rps = len(offsets_s) / span_s``."""

    offsets_s: np.ndarray
    span_s: float

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def offered_rps(self) -> float | None:
        return len(self.offsets_s) / self.span_s if self.span_s > 0 else None


def gaps(kind: ArrivalKind, rate_rps: float, n: int, rng: np.random.Generator, cv: float | None = None) -> np.ndarray:
    """``n`` gaps between arrivals at mean ``rate_rps``: constant 1/rate; exponential with mean 1/rate (a
    Poisson process); gamma with shape 1/cv² and scale cv²/rate (mean 1/rate, coefficient of variation cv)."""
    mean = 1.0 / rate_rps
    if kind == "constant":
        return np.full(n, mean)
    if kind == "poisson":
        return rng.exponential(mean, n)
    if kind == "gamma":
        if cv is None or cv <= 0:
            raise ValueError("gamma gaps need a coefficient of variation cv > 0")
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, mean / shape, n)
    raise ValueError(f"unknown arrival kind '{kind}'")


def rate_schedule(kind: ArrivalKind, rate_rps: float, requests: int, seed: Any, cv: float | None = None) -> Schedule:
    """``requests`` arrivals at ``rate_rps``: the first at 0, each next one gap later; the span is the sum of
    all ``requests`` gaps (the last gap closes it), so a constant schedule offers exactly ``rate_rps``."""
    g = gaps(kind, rate_rps, requests, np.random.default_rng(seed), cv)
    offsets = np.concatenate(([0.0], np.cumsum(g[:-1])))
    return Schedule(offsets, float(g.sum()))


def stages_schedule(kind: ArrivalKind, stages: Sequence[Stage], seed: Any, cv: float | None = None) -> Schedule:
    """The stages one after the other: in each, arrivals from the stage's start (the first at it), one gap of
    the stage's rate apart, while before the stage's end. The span is the stages' total duration."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    start = 0.0
    for st in stages:
        drawn: list[np.ndarray] = []
        total = 0.0
        batch = max(16, math.ceil(st.rate_rps * st.duration_s * 1.25) + 8)
        while total < st.duration_s:  # gaps until their sum passes the stage's end
            g = gaps(kind, st.rate_rps, batch, rng, cv)
            drawn.append(g)
            total += float(g.sum())
        t = np.concatenate(([0.0], np.cumsum(np.concatenate(drawn))))
        # before the end, with room for rounding: ten sums of 0.1 s make 0.9999999999999999, the stage's end, not before it
        parts.append(start + t[t < st.duration_s - 1e-9 * max(1.0, st.duration_s)])
        start += st.duration_s
    return Schedule(np.concatenate(parts) if parts else np.zeros(0), start)


def schedule(arrival: Arrival, key: str, repetition: int) -> Schedule:
    """The schedule of the open-loop phase ``key`` (a rate's key, or 'stages'), repetition ``repetition``: the
    same in every configuration (paired comparisons), another draw in every repetition and phase."""
    keys = arrival.keys()
    if key not in keys:
        raise ValueError(f"no open-loop phase '{key}'; phases: {', '.join(keys)}")
    seed = [arrival.seed & 0xFFFFFFFF, keys.index(key), repetition]
    rate = arrival.rate_of(key)
    if rate is not None:
        return rate_schedule(arrival.kind, rate, arrival.requests, seed, arrival.cv)
    return stages_schedule(arrival.kind, arrival.stages or [], seed, arrival.cv)


def arrival_prompt_offset(arrival: Arrival, repetitions: int, key: str, repetition: int) -> int:
    """Where open-loop phase (``key``, ``repetition``) starts in the prompt list: the phases, key by key and
    repetition by repetition, each use the next len(schedule) prompts (as ``runner_util.prompt_offset``)."""
    offset = 0
    for k in arrival.keys():  # noqa: SIM118  Arrival.keys() is the model's method (its phase keys), not a dict's
        for r in range(1, repetitions + 1):
            if (k, r) == (key, repetition):
                return offset
            offset += len(schedule(arrival, k, r))
    raise ValueError(f"no open-loop phase '{key}' repetition {repetition}")


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
    return round(math.log(rate_rps) / math.log(LEVEL_STEP)) if rate_rps > 0 else -(10**6)


def window_level(arrival: dict[str, Any], t0: float, t1: float, duration_s: float) -> int | None:
    """A window's load level (see ``level_of``), or None when the curve crossed into another level inside it (a
    stage changed, or a diurnal rate moved past 10%): the change detector does not judge such a window."""
    a, b = level_of(rate_at(arrival, t0, duration_s)), level_of(rate_at(arrival, max(t0, t1 - 1e-6), duration_s))
    if a != b:
        return None
    if arrival.get("stages"):
        bounds, _ = _stages(arrival)  # a stage shorter than the window may lie inside it
        first = math.floor(t0 / bounds[-1]) * bounds[-1]
        for k in range(math.ceil((t1 - first) / bounds[-1]) + 1):
            for x in first + k * bounds[-1] + bounds[:-1]:
                if t0 < x < t1 and level_of(rate_at(arrival, float(x), duration_s)) != a:
                    return None
    return a
