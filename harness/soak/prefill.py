"""A window's prefill index: how fast the engine gave its requests their first token once a slot was theirs, against
what this engine takes for such a prompt at such a load (issue #33: TTFT judged against the curve and the offered rate,
not against a settled level).

A request's TTFT is its wait for a slot, then its prefill. With ``slots`` slots served in order of arrival, a request
sent while m earlier requests are still in flight gets a slot when the (m - slots + 1)-th of them ends (``grants``):
the wait follows from the other requests' ends, which the speed index judges (harness/soak/speed.py), and from the
offered rate, which the overload rule judges (harness/soak/watchdog.py). What is left, the request's **service** (its
first token less its slot), is the engine's own work:

- **The model**: ``service = a x prompts + b x their tokens to process + c x streams decoding meanwhile``, where the
  prompts are its own and the share of every other prompt's service spent beside it (prompts served together share
  the engine), fitted by non-negative least squares (scipy ``nnls``) over this engine's requests:
  first the configuration's measurement phases on its fresh engine, then the soak's first ``learn_windows`` clean
  windows (those not far below the curve, as the speed model learns). The prompt tokens are the record's
  ``prompt_tokens`` less its ``cached_tokens`` (llama-server reports both in the final chunk's ``usage``:
  tests/fixtures/llamacpp/spec_self_draft.chat.stream_usage.sse.txt; a record without the cached count is taken as
  caching nothing); a record without either (the older committed fixtures) fits on the other terms.
- **The index** of a window: the services predicted over the services measured, summed over the requests whose first
  token came in it: about 1 at any load, backlog or level, 0.5 when prefill takes twice as long. Its sd is the ratio
  estimator's over those requests (Student-widened for few), never under one request's spread around the model over
  the square root of their count, as the speed index's.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

from harness.soak.speed import LEARN_PHASES, MIN_SPREAD_ROWS, PRIOR, SEEDED_LEARN_ABOVE, ratio_and_sd

MIN_SERVICE_S = 0.002  # a service shorter than this is the FIFO estimate's error, not a prefill: not counted
MAX_ROWS = 20_000
TOKENS_UNIT = 100.0  # the prompt term per hundred tokens (the fit's columns of like size)


@dataclass(frozen=True)
class Ask:
    """A request as its first token reads it: sent, first token, last token, the prompt tokens it had processed
    (None: not reported)."""

    start: float
    first: float
    end: float
    prompt: float | None


def ask_of(r: Mapping[str, Any]) -> Ask | None:
    """An ok record's ask; None when it says nothing of its timing."""
    if r.get("status") != "ok":
        return None
    start, ttft, e2e = r.get("start_unix_s"), r.get("ttft_s"), r.get("e2e_s")
    if not all(isinstance(v, int | float) for v in (start, ttft, e2e)):
        return None
    s = float(start)  # type: ignore[arg-type]
    n, cached = r.get("prompt_tokens"), r.get("cached_tokens")
    prompt = float(n) - float(cached or 0) if isinstance(n, int | float) else None
    return Ask(s, s + float(ttft), s + max(float(e2e), float(ttft)), prompt)  # type: ignore[arg-type]


def grant(a: Ask, asks: Sequence[Ask], slots: int) -> float:
    """When ``a`` got a slot, first come first served: its start if fewer than ``slots`` earlier asks were in flight
    then, else the end of the (m - slots + 1)-th of the m that were, never after its own first token."""
    ends = sorted(b.end for b in asks if b.start < a.start and b.end > a.start)
    wait_until = ends[len(ends) - slots] if len(ends) >= slots else a.start
    return min(max(a.start, wait_until), a.first)


def grants(asks: Sequence[Ask], slots: int) -> list[float]:
    return [grant(a, asks, slots) for a in asks]


def _overlap(lo: float, hi: float, intervals: Iterable[tuple[float, float]]) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in intervals if b > lo and a < hi)


def services(
    asks: Sequence[Ask], slots: int, t0: float = -math.inf, t1: float = math.inf
) -> list[tuple[Ask, float, float, np.ndarray]]:
    """Each ask whose first token came in ``[t0, t1)`` with its slot's time, its service seconds and its features, as
    ``a``, ``b`` and ``c`` multiply them: (1, prompt tokens / 100) for its own prompt plus, for every other prompt in
    service meanwhile, the share of that one's service spent beside it times the same (1, its tokens / 100), and the
    mean streams decoding during its service. Prompts served together share the engine: their work is counted with
    the same cost per prompt and per token, so a concurrency of prompts never learned is predicted, not read as a
    slowdown (a coefficient of its own, learned at a light rate as 0, read a busier stage's first window at 0.53).
    Asks whose service is under MIN_SERVICE_S are left out."""
    mine = [a for a in asks if t0 <= a.first < t1]
    if not mine:
        return []
    # the asks a service in the window can overlap: those in flight at some point between the first start and t1
    lo = min(a.start for a in mine)
    near = [b for b in asks if b.end > lo and b.start < t1]
    slot = {id(b): grant(b, asks, slots) for b in near}
    decoding = [(b.first, b.end) for b in near]
    out = []
    for a in mine:
        g = slot[id(a)]
        s = a.first - g
        if s < MIN_SERVICE_S:
            continue
        shared, tokens = 1.0, (a.prompt or 0.0)
        for b in near:
            sb = b.first - slot[id(b)]
            if b is a or sb < MIN_SERVICE_S:
                continue
            w = _overlap(g, a.first, [(slot[id(b)], b.first)]) / sb
            if w > 0:
                shared += w
                tokens += w * (b.prompt or 0.0)
        x = np.asarray([shared, tokens / TOKENS_UNIT, _overlap(g, a.first, decoding) / s])
        out.append((a, g, s, x))
    return out


@dataclass
class PrefillModel:
    """The service this engine takes for a prompt (its uncached tokens) while other streams decode or prefill."""

    slots: int
    coef: np.ndarray | None = None
    rows: list[np.ndarray] = field(default_factory=list, repr=False)
    y: list[float] = field(default_factory=list, repr=False)
    windows: int = 0
    phases: int = 0
    spread: float | None = None  # sd of one learned request's predicted over measured service

    @classmethod
    def from_phases(cls, records: Iterable[Mapping[str, Any]], slots: int) -> PrefillModel:
        """Learned from one configuration's measurement phases (``measure`` or ``arrivals``), phase by phase."""
        model = cls(slots)
        groups: dict[tuple[Any, ...], list[Ask]] = {}
        for r in records:
            if r.get("phase") in LEARN_PHASES and (a := ask_of(r)) is not None:
                groups.setdefault((r.get("phase"), r.get("streams"), r.get("repetition"), r.get("attempt")), []).append(
                    a
                )
        for asks in groups.values():
            model.learn(sorted(asks, key=lambda a: a.start), -math.inf, math.inf, window=False)
        return model

    def learn(self, asks: Sequence[Ask], t0: float, t1: float, window: bool = True) -> None:
        """Learn from the asks whose first token came in ``[t0, t1)``."""
        for _, _, s, x in services(asks, self.slots, t0, t1):
            if len(self.rows) < MAX_ROWS:
                self.rows.append(x)
                self.y.append(s)
        if window:
            self.windows += 1
        else:
            self.phases += 1
        if self.rows:
            coef, _ = nnls(np.asarray(self.rows), np.asarray(self.y))
            self.coef = coef if coef.any() else None
        if self.coef is not None:
            pred = np.asarray(self.rows) @ self.coef
            ok = pred > 0
            ratios = np.clip(pred[ok] / np.asarray(self.y)[ok], 0.2, 5.0)
            self.spread = float(np.std(ratios, ddof=1)) if len(ratios) >= MIN_SPREAD_ROWS else None

    def to_dict(self) -> dict[str, Any]:
        names = ("per_prompt_s", "per_100_tokens_s", "per_decoding_stream_s")
        return {
            **({n: round(float(c), 5) for n, c in zip(names, self.coef, strict=True)} if self.coef is not None else {}),
            "slots": self.slots,
            "rows": len(self.rows),
            "windows": self.windows,
            "phases": self.phases,
            "spread": round(self.spread, 4) if self.spread is not None else None,
        }


@dataclass(frozen=True)
class PrefillIndex:
    index: float
    sd: float
    requests: int
    service_s: float  # measured service, summed
    wait_s: float  # the same requests' waits for a slot, summed (the queue's share of their TTFT)


def prefill_index(asks: Sequence[Ask], t0: float, t1: float, model: PrefillModel) -> PrefillIndex | None:
    """The window's index over the asks whose first token came in ``[t0, t1)``; None before the model has a fit, or
    with no such ask (or one, before the model knows one request's spread)."""
    if model.coef is None:
        return None
    mine = services(asks, model.slots, t0, t1)
    n = len(mine)
    if n == 0 or (n < 2 and model.spread is None):
        return None
    pred = np.asarray([float(x @ model.coef) for *_, x in mine])
    obs = np.asarray([s for _, _, s, _ in mine])
    ratio, sd = ratio_and_sd(pred, obs, model.spread)
    wait = sum(g - a.start for a, g, _, _ in mine)
    return PrefillIndex(ratio, sd, n, float(obs.sum()), float(wait))


def prefill_figures(
    win: Mapping[str, Any], asks: Sequence[Ask], model: PrefillModel, learn_windows: int, warming_up: bool
) -> dict[str, Any]:
    """The window's ``prefill_index``, its sd (``prefill_index_sd``), prior and ``prefill`` detail, learning from it
    first when it is one of the model's first ``learn_windows`` clean windows (with a curve from the measurement, only
    when its index is not far below it). ``model`` is updated."""
    t0, t1 = float(win["t_start_unix"]), float(win["t_end_unix"])
    clean = not warming_up and not win.get("contaminated") and not (win.get("paused_s") or 0) > 0
    learning = clean and model.windows < learn_windows
    if learning and model.phases > 0 and model.coef is not None:
        first = prefill_index(asks, t0, t1, model)
        learning = first is None or first.index >= SEEDED_LEARN_ABOVE
    if learning:
        model.learn(asks, t0, t1)
    pi = prefill_index(asks, t0, t1, model)
    detail: dict[str, Any] = {"learned": learning, "model": model.to_dict()}
    if pi is not None:
        detail |= {"requests": pi.requests, "service_s": round(pi.service_s, 3), "wait_s": round(pi.wait_s, 3)}
    return {
        "prefill_index": pi.index if pi is not None else None,
        "prefill_index_sd": pi.sd if pi is not None else None,
        "prefill_index_prior": PRIOR if pi is not None and model.spread is not None else None,
        "prefill": detail,
    }
