"""Small statistics every layer shares: numbers from records, medians and quantiles, confidence intervals,
interpolation, expected tokens per step.

Pure functions of numbers, no I/O (tests/unit/test_report_stats.py); definitions: docs/metrics.md.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import numpy as np
from scipy import stats

CI_LEVEL = 0.95
# values each side of an unpaired ratio needs for an interval: each side's own spread (Welch)
UNPAIRED_MIN_PER_SIDE = 2


def isnum(v: object) -> bool:
    """A real number that is not NaN (numpy scalars included, booleans not)."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and not math.isnan(float(v))


def number_or_none(v: object, finite: bool = False) -> float | None:
    """``v`` as a float when it is a number (a numeric string too), else None: never a bool, never NaN, and with
    ``finite`` never ±inf. Records are data from outside: a field of the wrong type is no crash."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return None
    try:
        f = float(v)  # type: ignore[arg-type]  # any object: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(f) or (finite and math.isinf(f)) else f


def t_interval(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float | None, float | None]:
    """Student-t interval of the mean of ``values``; (None, None) with fewer than two values."""
    xs = [float(v) for v in values if isnum(v)]
    n = len(xs)
    if n < 2:
        return None, None
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def ratio_interval(ratios: Sequence[float], level: float = CI_LEVEL) -> tuple[float | None, float | None, float | None]:
    """(geometric mean, low, high) of paired ratios: the Student-t interval of their logarithms, back-transformed.

    A ratio of two speeds is symmetric in the log (0.5× is as far from 1 as 2×), and the point estimate is the
    centre of its own interval. (None, None, None) with no ratio; no interval with fewer than two."""
    xs = [math.log(float(r)) for r in ratios if isnum(r) and float(r) > 0]
    if not xs:
        return None, None, None
    centre = math.exp(sum(xs) / len(xs))
    lo, hi = t_interval(xs, level)
    if lo is None or hi is None:
        return centre, None, None
    return centre, math.exp(lo), math.exp(hi)


def unpaired_ratio_interval(
    before: Sequence[float], after: Sequence[float], level: float = CI_LEVEL
) -> tuple[float | None, float | None, float | None]:
    """(ratio, low, high) of after over before from two unpaired samples: Welch's two-sample Student-t interval of the
    difference of their mean logarithms (each side's own spread), back-transformed. Each side needs two values: one
    value has no spread of its own, and lending it the other side's calls machine drift a change (docs/soak.md#coverage);
    (ratio, None, None) with fewer or no spread, (None, None, None) with an empty side."""
    b = [math.log(float(x)) for x in before if isnum(x) and float(x) > 0]
    a = [math.log(float(x)) for x in after if isnum(x) and float(x) > 0]
    if not a or not b:
        return None, None, None
    mb, ma = sum(b) / len(b), sum(a) / len(a)
    centre = math.exp(ma - mb)
    if len(a) < UNPAIRED_MIN_PER_SIDE or len(b) < UNPAIRED_MIN_PER_SIDE:
        return centre, None, None
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se2 = va + vb
    if se2 <= 0:
        return centre, None, None
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return centre, math.exp(ma - mb - half), math.exp(ma - mb + half)


def shown_difference(lo: object, hi: object) -> str | None:
    """'faster' or 'slower' when the interval [lo, hi] of a ratio excludes 1.0, 'no difference shown' when it
    straddles it, None without an interval: a ratio is never called a win or a loss on its point alone."""
    if not (isnum(lo) and isnum(hi)):
        return None
    if float(lo) > 1.0:  # type: ignore[arg-type]  # isnum() checked both are real numbers
        return "faster"
    if float(hi) < 1.0:  # type: ignore[arg-type]  # isnum() checked both are real numbers
        return "slower"
    return "no difference shown"


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 − α^(K+1)) / (1 − α): tokens one verification step yields if each drafted token is
    accepted with probability α independently, bonus token included; K+1 when α = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance must be within [0, 1], got {alpha}")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class BreakEven(TypedDict):
    kind: str  # crosses, never, always, mixed or unknown
    streams: float | None
    evidence: list[tuple[int, float]]  # the (streams, speedup) points behind the kind


def break_even(points: Sequence[tuple[int, float]]) -> BreakEven:
    """Where a speedup curve stops beating 1.0, from (streams, speedup) points.

    Returns ``kind`` = ``crosses`` (with ``streams`` linearly interpolated between the last
    winning N and the first losing N, both given as evidence), ``never`` (it beats the baseline at
    every measured N: no break-even within them), ``always`` (it beats the baseline at no measured
    N), ``mixed`` (loses first, wins later) or ``unknown`` (no points).
    """
    pts = sorted((int(n), float(s)) for n, s in points if isnum(s))
    if not pts:
        return {"kind": "unknown", "streams": None, "evidence": []}
    if all(s > 1.0 for _, s in pts):
        return {"kind": "never", "streams": None, "evidence": [pts[-1]]}
    if all(s <= 1.0 for _, s in pts):
        return {"kind": "always", "streams": float(pts[0][0]), "evidence": [pts[0]]}
    for (n1, s1), (n2, s2) in itertools.pairwise(pts):
        if s2 <= 1.0 < s1:
            at = n1 + (s1 - 1.0) * (n2 - n1) / (s1 - s2)
            return {"kind": "crosses", "streams": at, "evidence": [(n1, s1), (n2, s2)]}
    return {"kind": "mixed", "streams": None, "evidence": pts}  # loses first, wins later: no single break-even


def _between_ranks(xs: list[float], pos: float) -> float:
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of the numbers in ``values``, linear between the closest ranks (numpy's default)."""
    xs = sorted(float(v) for v in values if isnum(v))
    return _between_ranks(xs, (len(xs) - 1) * q / 100.0) if xs else None


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0-1) of the numbers in ``values``, linear between the closest ranks (numpy's default)."""
    xs = sorted(float(v) for v in values if isnum(v))
    return _between_ranks(xs, q * (len(xs) - 1)) if xs else None


def median(values: Iterable[Any]) -> float | None:
    """The median of the numbers in ``values`` (None, NaN and non-numbers left out); None when there are none."""
    xs = sorted(float(v) for v in values if isnum(v))
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2
