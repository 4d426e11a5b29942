"""A window's speed index: the tokens the engine streamed against what it streams at the concurrency it had.

A window's throughput and per-request decode follow the load (how many streams shared the engine, how big the queue
was), so they can only be compared with windows at the same settled load, and a slowed engine under open-loop load
never settles (issue #33). The engine's own curve does not move with the load. ``SpeedModel`` learns, from this
engine's own requests, how fast one stream decodes while k streams decode together, with or without a prompt being
processed at the same moment; a window's index is the decode tokens its requests streamed over what that predicts for
the concurrency they had moment by moment: about 1 at any load, backlog or level, 0.5 when the engine halves its speed.

- **Spans**: a request waits or prefills from its start to its first token, and decodes from then to its end, its
  output tokens after the first spread evenly over that span. Only fields every request record has (the committed
  fixtures are cut down to them); a stall inside a request stretches its span either way.
- **The model**: one stream's rate while k streams decode, ``r(k, p) = T1 x min(k, k_max)**beta / k``, times ``rho``
  while a prompt is being processed (``p``: some request between its start and first token). On llama-server a
  prompt's batch stalls every stream (rho about 0 in the two-hour soak's records), and how often that happens is the
  load's doing: without ``p`` the index fell to 0.75 at the busier stage. ``beta`` (0: the engine's total rate does not
  grow with streams, as on this CPU; 1: each stream as fast as one alone) is fitted on a grid, ``T1`` and ``rho T1`` by
  non-negative least squares over the requests, each request's tokens against its seconds in each state. Beyond the
  largest concurrency learned for ``MIN_LEVEL_S`` the total rate is taken as flat: a lower bound, so a level never
  learned can hide a slowdown, never invent one.
- **The prior**: a window's index is 1 on an engine at its curve, so the change detector judges it against 1 from
  the first window after warm-up (``speed_index_prior``), until the soak has built the index's own reference, once
  the curve knows one request's spread (from the measurement's requests, or the soak's first learned windows).
- **The index** of a window: ``sum(tokens) / sum(predicted)`` over the parts of its requests' spans inside it, and its
  standard error the ratio estimator's over those requests (as acceptance's count sd), never under one request's
  spread around the curve over the square root of their count: one request is enough for an index once the spread is
  known, and the detector weighs such a window in its own, wider sd (``weigh_window``).
  ``rho`` is fitted once ``MIN_PROMPT_S`` of decoding beside a prompt has been learned, and is 0 before (a lower bound
  again).
- **Learning**: first the configuration's measurement phases on its fresh engines (1 to N streams, before the soak:
  ``SpeedModel.from_phases``), so the curve exists before the soak's first window and holds the fresh engine's
  speed; then the soak's first ``learn_windows`` eligible windows (after warm-up, not contaminated, not paused; with a
  measured curve, only those whose index is at least SEEDED_LEARN_ABOVE, or LEARN_ABOVE past its ``k_max``), then a
  later window only when it decoded at a concurrency above ``k_max`` and its index is not low (a slowed engine at a
  new level must not become its curve). A concurrency the measurement phases decoded at for ``MIN_PHASE_LEVEL_S`` in all is
  learned: measure the streams the soak will run (``measurement.streams`` up to ``server.parallel``), or a slowdown
  at a level first met slowed can read as that level's curve (the soak says so when it starts: ``outruns_curve``).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls
from scipy.stats import norm
from scipy.stats import t as t_dist

MIN_LEVEL_S = 60.0  # decode seconds at one concurrency before the model extrapolates past it
# a concurrency the fresh engine's measurement phases decoded at for this long (over all of them) is learned too: those
# phases run on the fresh engine, so their levels are the curve itself (a soak window at a new level may already be
# slowed); a 4-stream phase of 2 x 32-token answers decoded 1.5 s at 4 on this CPU (2026-12-06)
MIN_PHASE_LEVEL_S = 1.0
MIN_PROMPT_S = 20.0  # decode seconds beside a prompt in progress before rho is fitted (before: 0, a lower bound)
MIN_DECODE_SHARE = 0.01  # a window's index needs its requests decoding for at least this share of it
# and this many requests decoding in it: one is enough once the model knows how far one request strays from its curve
# (``spread``): a night's trough sends a request or two a minute, and those windows are judged too (issue #33)
MIN_REQUESTS = 1
MIN_SPREAD_ROWS = 10  # requests learned before their spread around the curve is taken as one request's noise
BETAS = np.linspace(0.0, 1.0, 21)
MAX_ROWS = 20_000  # requests the model keeps to fit on (a day of learning at several a second)
LEARN_PHASES = ("measure", "arrivals")  # the measurement phases the curve starts from (not warm-up, not after the soak)


@dataclass(frozen=True)
class Span:
    start: float  # unix s the request was sent
    first: float  # of its first token
    end: float  # of its last
    tokens: float  # tokens after the first


def span_of(r: Mapping[str, Any]) -> Span | None:
    """An ok record's span; None when it streamed one token or says nothing of its timing."""
    if r.get("status") != "ok":
        return None
    start, ttft, e2e, n = r.get("start_unix_s"), r.get("ttft_s"), r.get("e2e_s"), r.get("output_tokens")
    if not all(isinstance(v, int | float) for v in (start, ttft, e2e, n)):
        return None
    after_first = float(n) - 1.0  # type: ignore[arg-type]  # the first token is the prompt's (its chunk's others are few)
    s, a, b = float(start), float(start) + float(ttft), float(start) + float(e2e)  # type: ignore[arg-type]
    return Span(s, a, b, after_first) if after_first > 0 and b > a else None


def spans_of(records: Sequence[Mapping[str, Any]]) -> list[Span]:
    return [s for s in map(span_of, records) if s is not None]


def _states(spans: Sequence[Span], t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``[t0, t1)`` cut where any span starts or ends: (cut points, seconds of each piece, streams decoding in it,
    whether a prompt was being processed in it). Pieces of zero length are dropped."""
    cuts = [t0, t1]
    for s in spans:
        if s.end > t0 and s.start < t1:
            cuts.extend(x for x in (s.start, s.first, s.end) if t0 < x < t1)
    edges = np.unique(np.asarray(cuts, dtype=float))
    mids = (edges[:-1] + edges[1:]) / 2
    k = np.zeros(len(mids), dtype=int)
    p = np.zeros(len(mids), dtype=bool)
    for s in spans:
        if s.end > t0 and s.start < t1:
            k += (mids >= s.first) & (mids < s.end)
            p |= (mids >= s.start) & (mids < s.first)
    return edges, np.diff(edges), k, p


def _rows(
    spans: Sequence[Span], t0: float, t1: float
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], list[float]]:
    """Per request decoding in ``[t0, t1)``: its pieces there (seconds, streams decoding, prompt in progress) and its
    tokens in them."""
    edges, dt, k, p = _states(spans, t0, t1)
    mids = (edges[:-1] + edges[1:]) / 2
    rows, tokens = [], []
    for s in spans:
        if s.end > t0 and s.first < t1:
            on = (mids >= s.first) & (mids < s.end)
            if on.any():
                rows.append((dt[on], k[on], p[on]))
                tokens.append(float(dt[on].sum()) * s.tokens / (s.end - s.first))
    return rows, tokens


@dataclass
class SpeedModel:
    """How fast one stream of this engine decodes while k stream decode, with and without a prompt in progress."""

    t1: float | None = None  # tokens/s of one stream alone, no prompt in progress
    rho: float = 1.0  # the rate's share left while a prompt is processed
    beta: float = 0.0
    k_max: int = 1  # the largest concurrency learned for MIN_LEVEL_S (or MIN_PHASE_LEVEL_S in a measurement phase)
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list, repr=False)
    tokens: list[float] = field(default_factory=list, repr=False)
    seconds_at: dict[int, float] = field(default_factory=dict)  # decode seconds learned per concurrency
    phase_s: dict[int, float] = field(default_factory=dict)  # of seconds_at, those in measurement phases
    prompt_s: float = 0.0  # decode seconds learned while a prompt was in progress
    windows: int = 0  # soak windows learned from
    phases: int = 0  # measurement phases learned from, before the soak
    spread: float | None = None  # sd of one learned request's tokens over what the curve predicts for it

    @classmethod
    def from_phases(cls, records: Iterable[Mapping[str, Any]]) -> SpeedModel:
        """A model learned from one configuration's measurement phases (request records of phase ``measure`` or
        ``arrivals``, each phase from its first request's start to its last one's end): the fresh engine's curve."""
        model = cls()
        groups: dict[tuple[Any, ...], list[Span]] = {}
        for r in records:
            if r.get("phase") in LEARN_PHASES and (s := span_of(r)) is not None:
                key = (r.get("phase"), r.get("streams"), r.get("repetition"), r.get("attempt"))
                groups.setdefault(key, []).append(s)
        for spans in groups.values():
            model.learn(spans, min(s.start for s in spans), max(s.end for s in spans), window=False)
        return model

    def learn(self, spans: Sequence[Span], t0: float, t1: float, window: bool = True) -> None:
        """Learn from the requests decoding in ``[t0, t1)``: a soak window, or (``window`` False) a measurement phase."""
        rows, tokens = _rows(spans, t0, t1)
        room = MAX_ROWS - len(self.rows)
        self.rows.extend(rows[:room])
        self.tokens.extend(tokens[:room])
        _, dt, k, p = _states(spans, t0, t1)
        for level in np.unique(k[k > 0]):
            seconds = float(dt[k == level].sum())
            self.seconds_at[int(level)] = self.seconds_at.get(int(level), 0.0) + seconds
            if not window:
                self.phase_s[int(level)] = self.phase_s.get(int(level), 0.0) + seconds
        self.prompt_s += float(dt[(k > 0) & p].sum())
        if window:
            self.windows += 1
        else:
            self.phases += 1
        self._fit()

    def _fit(self) -> None:
        if not self.rows:
            return
        learned = [j for j, s in self.seconds_at.items() if s >= MIN_LEVEL_S or j in self.measured_at()]
        self.k_max = max(learned) if learned else min(self.seconds_at, default=1)
        y = np.asarray(self.tokens)
        best: tuple[float, float, float, float] | None = None
        for beta in BETAS:
            x = np.asarray([_features(dt, k, p, beta, self.k_max) for dt, k, p in self.rows])
            coef, resid = nnls(x, y)
            if coef[0] > 0 and (best is None or resid < best[0]):
                best = (float(resid), float(beta), float(coef[0]), float(coef[1]))
        if best is not None:
            _, self.beta, self.t1, prefill = best
            # too little decoding beside a prompt says nothing of it: 0, the lower bound (an index too high, not low)
            self.rho = min(1.0, prefill / self.t1) if self.prompt_s >= MIN_PROMPT_S else 0.0
            x = np.asarray([_features(dt, k, p, self.beta, self.k_max) for dt, k, p in self.rows])
            predicted = self.t1 * (x[:, 0] + self.rho * x[:, 1])
            fit = predicted > 1.0  # a request the curve gives a token or more
            # one request's noise around the curve (its context, its prompt, the machine): a sparse window's sd
            ratios = np.clip(y[fit] / predicted[fit], 0.2, 5.0)
            self.spread = float(np.std(ratios, ddof=1)) if len(ratios) >= MIN_SPREAD_ROWS else None

    def measured_at(self) -> list[int]:
        """The concurrencies the measurement phases decoded at for MIN_PHASE_LEVEL_S in all."""
        return sorted(j for j, s in self.phase_s.items() if s >= MIN_PHASE_LEVEL_S)

    def rate(self, k: np.ndarray, p: np.ndarray) -> np.ndarray:
        """One stream's predicted tokens/s in each piece (k streams decoding, a prompt in progress or not)."""
        assert self.t1 is not None
        kk = np.maximum(k, 1).astype(float)
        out: np.ndarray = self.t1 * np.where(p, self.rho, 1.0) * np.minimum(kk, self.k_max) ** self.beta / kk
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "t1_tps": round(self.t1, 3) if self.t1 is not None else None,
            "rho": round(self.rho, 4),
            "beta": round(self.beta, 3),
            "k_max": self.k_max,
            "windows": self.windows,
            "phases": self.phases,
            "spread": round(self.spread, 4) if self.spread is not None else None,
            "prompt_s": round(self.prompt_s, 1),
            "seconds_at": {str(j): round(s, 1) for j, s in sorted(self.seconds_at.items())},
            "measured_at": self.measured_at(),
        }


def _features(dt: np.ndarray, k: np.ndarray, p: np.ndarray, beta: float, k_max: int) -> tuple[float, float]:
    """A request's seconds in each state, weighted as T1 and rho T1 multiply them: ``min(k, k_max)**beta / k``."""
    kk = np.maximum(k, 1)
    w = dt * np.minimum(kk, k_max) ** beta / kk
    return float(w[~p].sum()), float(w[p].sum())


@dataclass(frozen=True)
class SpeedIndex:
    index: float
    sd: float | None  # the ratio estimator's standard error over the window's requests
    decode_s: float  # seconds of the window some request was decoding
    requests: int  # requests decoding in it
    k_max: int  # the largest concurrency in it

    def to_dict(self) -> dict[str, Any]:
        return {"decode_s": round(self.decode_s, 3), "requests": self.requests, "k_max": self.k_max}


def speed_index(spans: Sequence[Span], t0: float, t1: float, model: SpeedModel) -> SpeedIndex | None:
    """The window's index; None before the model has learned anything, or when its requests decoded for under
    MIN_DECODE_SHARE of it, fewer than MIN_REQUESTS decoded in it, or one did and the model does not yet know one
    request's spread. Its sd: the ratio estimator's over the window's requests, and never under what one request's
    spread around the curve implies for that many (``spread / sqrt(n)``, relative)."""
    if model.t1 is None:
        return None
    rows, tokens = _rows(spans, t0, t1)
    _, dt, k, _ = _states(spans, t0, t1)
    busy = float(dt[k > 0].sum())
    n = len(rows)
    if n < MIN_REQUESTS or busy < MIN_DECODE_SHARE * (t1 - t0) or (n < 2 and model.spread is None):
        return None
    g = np.asarray(tokens)
    w = np.asarray([float((d * model.rate(kk, pp)).sum()) for d, kk, pp in rows])
    if w.sum() <= 0:
        return None
    ratio, sd = ratio_and_sd(g, w, model.spread)
    return SpeedIndex(ratio, sd, busy, n, int(k.max()))


def ratio_and_sd(got: np.ndarray, want: np.ndarray, spread: float | None) -> tuple[float, float]:
    """``sum(got) / sum(want)`` over a window's requests and its sd: the ratio estimator's standard error, widened as
    Student's t widens a mean of n, never under ``spread * ratio / sqrt(n)`` (one request's learned spread)."""
    n = len(got)
    ratio = float(got.sum() / want.sum())
    sd = math.sqrt(float(((got - ratio * want) ** 2).sum()) / (n * (n - 1))) / float(want.mean()) if n >= 2 else 0.0
    # an sd taken from the window's own few requests is itself uncertain: widened as Student's t widens a mean of n,
    # so two requests that disagree weigh little (bench/real_path.py: a healthy diurnal trough's 2-request window read
    # 0.56 against 1.11 and, beside the window before it, made a false collapse); the learned spread is no estimate
    # from this window, so its bound is not widened
    sd *= float(t_dist.ppf(0.975, max(n - 1, 1)) / norm.ppf(0.975))
    if spread is not None:
        sd = max(sd, spread * ratio / math.sqrt(n))
    return ratio, sd


PRIOR = 1.0  # a window's index against a curve that holds: the change detector's reference until it has its own
LEARN_ABOVE = 0.9  # after its first windows the model learns a new concurrency only from a window this fast or faster
# a curve learned from the measurement phases takes the soak's first windows only when they are not far below it (the
# soak's own prompts may decode a little slower than the measurement's; an engine slowed from the start must not
# become its curve)
SEEDED_LEARN_ABOVE = 0.75


def speed_figures(
    win: Mapping[str, Any], spans: Sequence[Span], model: SpeedModel, learn_windows: int, warming_up: bool
) -> dict[str, Any]:
    """The window's ``speed_index`` and its ``speed`` detail, learning from it first when it is one of the model's
    first ``learn_windows`` clean windows (not warm-up, not contaminated, no engine pause), or after them when it
    decoded at a concurrency above what the model has learned and its index is not low. ``model`` is updated."""
    t0, t1 = float(win["t_start_unix"]), float(win["t_end_unix"])
    clean = not warming_up and not win.get("contaminated") and not (win.get("paused_s") or 0) > 0
    learning = clean and model.windows < learn_windows
    if learning and model.phases > 0:  # a curve the fresh engine's measurement began: refined, not overwritten
        first = speed_index(spans, t0, t1, model)
        # past the measured concurrency the curve is a lower bound, so only a window as fast as LEARN_ABOVE extends it
        floor = SEEDED_LEARN_ABOVE if first is None or first.k_max <= model.k_max else LEARN_ABOVE
        learning = first is None or first.index >= floor
    if learning:
        model.learn(spans, t0, t1)
    si = speed_index(spans, t0, t1, model)
    if not learning and clean and si is not None and si.k_max > model.k_max and si.index >= LEARN_ABOVE:
        learning = True
        model.learn(spans, t0, t1)
    detail = {**(si.to_dict() if si is not None else {}), "learned": learning, "model": model.to_dict()}
    return {
        "speed_index": si.index if si is not None else None,
        "speed_index_sd": si.sd if si is not None else None,
        # the index's reference before the soak has built its own: 1, the curve itself, once the curve knows how far
        # one request strays from it (MIN_SPREAD_ROWS requests learned; the default measurement's ten do)
        "speed_index_prior": PRIOR if si is not None and model.spread is not None else None,
        "speed": detail,
    }
