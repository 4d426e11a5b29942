"""The request-rate sweep's judgements, pure functions over open-loop phase records (runner and report share them).

A rate is **saturated** for a configuration when what it serves stops following what it is offered:

- its responses complete at less than ``completion_ratio_min`` of the rate the requests were scheduled at
  (``completion_rps`` over ``schedule_rps``, both first-to-last, so the last answers' tail does not count;
  records without them fall back to achieved over offered);
- more than ``late_share_max`` of its requests were sent late because they waited for a slot (``max_in_flight``
  in flight at their time: ``queued``). A send the client itself made a few ms late is recorded late but is not
  the engine falling behind; records from before ``queued`` count every late send;
- with an SLO, fewer than ``goodput_ratio_min`` of its requests met it (the SLO broke before the throughput did).

The **saturation point** of a configuration is the first rate, ascending, judged saturated; the highest rate
below it is the highest it **sustains**. Where speculation **stops paying** in requests per second: the rates at
which a speculative configuration beats its baseline (no less goodput, a lower median latency counted from the
scheduled time), and the highest of them. Definitions: docs/metrics.md#rate-sweep.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.common.stats import number_or_none

GOODPUT_TOLERANCE = 0.02  # goodput within 2% of the baseline's counts as no less


@dataclass(frozen=True)
class Rule:
    """The bounds of ``measurement.arrival.saturation`` (harness/config/schema.py ``Saturation``)."""

    completion_ratio_min: float = 0.9
    late_share_max: float = 0.1
    goodput_ratio_min: float = 0.9

    @classmethod
    def of(cls, cfg: Any) -> Rule:
        """From the scenario's model or its dumped dict (a run's manifest); defaults where absent."""
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
        d = cls()
        return cls(
            *(
                float(get(f, getattr(d, f)) if get(f, None) is not None else getattr(d, f))
                for f in ("completion_ratio_min", "late_share_max", "goodput_ratio_min")
            )
        )


@dataclass(frozen=True)
class Judgement:
    """One rate (one phase, or the medians over its repetitions): saturated or not, and why."""

    saturated: bool
    why: str  # every bound crossed, '; '-separated; '' when none
    completion_ratio: float | None
    late_share: float | None
    goodput_ratio: float | None


_num = number_or_none


def ratios(phase: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(completion ratio, late share, goodput ratio) of one open-loop phase record (docs/metrics.md#rate-sweep)."""
    comp, sched = _num(phase.get("completion_rps")), _num(phase.get("schedule_rps"))
    completion: float | None
    if comp is not None and sched:
        completion = comp / sched
    else:  # records from before completion_rps, or a phase with fewer than two completions
        ach, off = _num(phase.get("achieved_rps")), _num(phase.get("offered_rps"))
        completion = ach / off if ach is not None and off else (0.0 if sched and not _num(phase.get("ok")) else None)
    n = _num(phase.get("scheduled")) or _num(phase.get("requests"))
    queued = _num(phase.get("queued"))
    late = queued if queued is not None else _num(phase.get("late"))
    late_share = late / n if late is not None and n else None
    met = _num(phase.get("slo_met"))
    goodput = met / n if met is not None and n else None
    return completion, late_share, goodput


def judge_ratios(completion: float | None, late_share: float | None, goodput: float | None, rule: Rule) -> Judgement:
    why = []
    if completion is not None and completion < rule.completion_ratio_min:
        why.append(f"completions {completion:.2f}× the scheduled rate (< {rule.completion_ratio_min:g})")
    if late_share is not None and late_share > rule.late_share_max:
        why.append(f"{late_share:.0%} sent late, waiting for a slot (> {rule.late_share_max:.0%})")
    if goodput is not None and goodput < rule.goodput_ratio_min:
        why.append(f"{goodput:.0%} met the SLO (< {rule.goodput_ratio_min:.0%})")
    return Judgement(bool(why), "; ".join(why), completion, late_share, goodput)


def judge(phase: Mapping[str, Any], rule: Rule) -> Judgement:
    """One phase record."""
    return judge_ratios(*ratios(phase), rule)


def judge_rate(phases: Sequence[Mapping[str, Any]], rule: Rule) -> Judgement:
    """A rate measured in several repetitions: the median of each ratio over them, then the bounds."""

    def med(values: Iterable[float | None]) -> float | None:
        v = [x for x in values if x is not None]
        return statistics.median(v) if v else None

    rs = [ratios(p) for p in phases]
    return judge_ratios(med(r[0] for r in rs), med(r[1] for r in rs), med(r[2] for r in rs), rule)


@dataclass(frozen=True)
class SaturationPoint:
    """``kind``: 'saturated' (``saturation_rps`` is the first saturated rate, ``sustained_rps`` the highest below it,
    None when the lowest rate already saturated), or 'not reached' (no rate saturated: ``sustained_rps`` is a
    lower bound), or 'no rates'."""

    kind: str
    sustained_rps: float | None
    saturation_rps: float | None
    why: str


def saturation_point(points: Sequence[tuple[float, Judgement]]) -> SaturationPoint:
    """``points``: (rate, its judgement) of every measured rate. The first saturated rate, ascending."""
    pts = sorted(points, key=lambda p: p[0])
    if not pts:
        return SaturationPoint("no rates", None, None, "")
    sustained: float | None = None
    for rate, j in pts:
        if j.saturated:
            return SaturationPoint("saturated", sustained, rate, j.why)
        sustained = rate
    return SaturationPoint("not reached", sustained, None, "")


def stop_sweep(judgements: Sequence[Judgement], stop_after: int | None) -> bool:
    """The adaptive sweep: stop a repetition's higher rates once the last ``stop_after`` rates all saturated."""
    return (
        stop_after is not None and len(judgements) >= stop_after and all(j.saturated for j in judgements[-stop_after:])
    )


@dataclass(frozen=True)
class PaysAt:
    """A speculative configuration against its baseline at one rate."""

    rate_rps: float
    pays: bool
    latency_ratio: float | None  # configuration's median latency from the scheduled time over the baseline's
    goodput_ratio: float | None  # configuration's goodput over the baseline's (None without an SLO)


def pays_at(rate_rps: float, latency_ratio: float | None, goodput: float | None, base_goodput: float | None) -> PaysAt:
    """It pays at a rate when its median latency from the scheduled time is below the baseline's (``latency_ratio``:
    its over the baseline's, paired by repetition, < 1) and its goodput, where an SLO gives one, is no less than the
    baseline's (within ``GOODPUT_TOLERANCE``)."""
    gp: float | None = None
    if goodput is not None and base_goodput is not None:  # a baseline with no goodput at all: any is no less
        gp = goodput / base_goodput if base_goodput > 0 else (math.inf if goodput > 0 else 1.0)
    pays = latency_ratio is not None and latency_ratio < 1.0 and (gp is None or gp >= 1.0 - GOODPUT_TOLERANCE)
    return PaysAt(rate_rps, pays, latency_ratio, gp)


def stops_paying(points: Sequence[PaysAt]) -> tuple[str, float | None, float | None]:
    """(kind, highest rate where it pays, first rate above that where it does not). Kinds: 'crosses' (pays up to a
    rate, not above it), 'always' (pays at every rate), 'never' (at none), 'mixed' (pays above a rate where it did
    not: the highest rate it pays at is given), 'no rates'."""
    pts = sorted(points, key=lambda p: p.rate_rps)
    if not pts:
        return "no rates", None, None
    paying = [p.rate_rps for p in pts if p.pays]
    if not paying:
        return "never", None, pts[0].rate_rps
    if len(paying) == len(pts):
        return "always", paying[-1], None
    first_not = next((p.rate_rps for p in pts if p.rate_rps > paying[-1]), None)
    prefix = all(p.pays for p in pts[: len(paying)])
    return ("crosses" if prefix else "mixed"), paying[-1], first_not
