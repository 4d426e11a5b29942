"""Drift over hours: a robust trend test with a confidence bound, not a threshold.

Each watched series (acceptance, decode t/s, TTFT p95, engine RSS) is aggregated per window;
over the windows so far, the Theil-Sen slope (median of pairwise slopes, insensitive to
outliers) gets a confidence interval, and Kendall's tau tests that the order is not random
(the Mann-Kendall trend test). A drift verdict needs all three: the interval excludes zero
on the bad side, the test is significant at ``alpha``, and the change the slope implies over
the observed span is at least ``min_change`` of the series' median.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Trend:
    metric: str
    n: int
    slope_per_hour: float
    slope_low_per_hour: float
    slope_high_per_hour: float
    p_value: float
    median: float
    relative_change: float  # slope x span / |median|
    drifting: bool
    bad_direction: int  # +1: rising is bad (TTFT, RSS); -1: falling is bad (acceptance, t/s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trend(metric: str, t_s: list[float], y: list[float], bad_direction: int, alpha: float = 0.01, min_change: float = 0.1) -> Trend | None:
    """Test one series; None when there are fewer than 3 finite points or no spread in time."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(y, dtype=float)
    keep = np.isfinite(t) & np.isfinite(v)
    t, v = t[keep], v[keep]
    if len(v) < 3 or np.ptp(t) <= 0:
        return None
    hours = (t - t[0]) / 3600.0
    if np.ptp(v) == 0:
        med = float(np.median(v))
        return Trend(metric, len(v), 0.0, 0.0, 0.0, 1.0, med, 0.0, False, bad_direction)
    res = stats.theilslopes(v, hours, alpha=1 - alpha)
    tau = stats.kendalltau(hours, v)
    p = float(tau.pvalue) if np.isfinite(tau.pvalue) else 1.0
    med = float(np.median(v))
    span = float(hours[-1] - hours[0])
    rel = float(res.slope * span / abs(med)) if med != 0 else float("inf")
    lo, hi = float(res.low_slope), float(res.high_slope)
    excludes_zero_bad = lo > 0 if bad_direction > 0 else hi < 0
    drifting = excludes_zero_bad and p < alpha and abs(rel) >= min_change and np.sign(rel) == bad_direction
    return Trend(metric, len(v), float(res.slope), lo, hi, p, med, rel, bool(drifting), bad_direction)


# The series the watchdog watches and which way is bad.
WATCHED = {
    "acceptance": -1,
    "decode_tps": -1,
    "ttft_p95_s": +1,
    "engine_memory_mib": +1,
}
