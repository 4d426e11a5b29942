"""Drift over hours: a robust trend test with a confidence bound, not a threshold.

Each watched series (acceptance, decode t/s, TTFT p95, engine memory) is aggregated per window;
over the windows so far, the Theil-Sen slope (median of pairwise slopes, insensitive to
outliers) gets a confidence interval, and Kendall's tau tests that the order is not random
(the Mann-Kendall trend test). A drift verdict needs all three: the interval excludes zero
on the bad side, the test is significant at ``alpha``, and the change the slope implies over
the observed span is at least ``min_change`` of the series' median.

Like with like: given each window's load level (``levels``), only windows at the same level are compared
(the seasonal Kendall test: Mann-Kendall's S and its variance summed over levels, and the Theil-Sen slope
as the median of the within-level pairwise slopes of each level's values relative to its own median), so
a staged or diurnal day, whose figures move with the load, is not a drift.
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


def trend(
    metric: str,
    t_s: list[float],
    y: list[float],
    bad_direction: int,
    alpha: float = 0.01,
    min_change: float = 0.1,
    levels: list[Any] | None = None,
) -> Trend | None:
    """Test one series; None when there are fewer than 3 finite points or no spread in time. ``levels``: each point's
    load level; with more than one, points are compared only within their level (``_by_level``)."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(y, dtype=float)
    keep = np.isfinite(t) & np.isfinite(v)
    if levels is not None:
        if len(levels) != len(t):
            raise ValueError(f"{len(t)} times but {len(levels)} levels")
        lv = [x for x, k in zip(levels, keep, strict=True) if k]
        if len(set(lv)) > 1:
            return _by_level(metric, t[keep], v[keep], lv, bad_direction, alpha, min_change)
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


# The series the watchdog watches and which way is bad; the change detector's rule for each says in which soaks
# (open or closed loop) and whether per load level (harness/detect/changepoint.py WATCHED_CHANGES)
WATCHED = {
    "acceptance": -1,
    "decode_tps": -1,
    "alone_decode_tps": -1,
    "ttft_p95_s": +1,
    "engine_memory_mib": +1,
}


def _by_level(
    metric: str, t: np.ndarray, v: np.ndarray, levels: list[Any], bad_direction: int, alpha: float, min_change: float
) -> Trend | None:
    """The seasonal Kendall test (Hirsch, Slack & Smith 1982) over load levels: S and Var(S) summed over the levels
    (each with at least 3 points), the slope the median of the within-level pairwise slopes of values relative to
    their level's median, its interval from the ranks of Var(S) as Sen's, the change over the whole observed span."""
    s_total, var_total, n_total = 0.0, 0.0, 0
    slopes: list[np.ndarray] = []
    for level in dict.fromkeys(levels):
        idx = np.array([i for i, x in enumerate(levels) if x == level])
        if len(idx) < 3:
            continue
        tt, vv = t[idx], v[idx]
        order = np.argsort(tt, kind="stable")
        tt, vv = tt[order], vv[order]
        med = float(np.median(vv))
        if med == 0:
            continue
        i, j = np.triu_indices(len(vv), 1)
        s_total += float(np.sign(vv[j] - vv[i]).sum())
        _, ties = np.unique(vv, return_counts=True)
        n = len(vv)
        var_total += (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
        dt = (tt[j] - tt[i]) / 3600.0
        ok = dt > 0
        slopes.append((vv[j][ok] - vv[i][ok]) / abs(med) / dt[ok])
        n_total += n
    if n_total < 3 or not slopes or np.ptp(t) <= 0:
        return None
    sl = np.sort(np.concatenate(slopes))
    med_all = float(np.median(v))
    if var_total <= 0 or len(sl) == 0:
        return Trend(metric, n_total, 0.0, 0.0, 0.0, 1.0, med_all, 0.0, False, bad_direction)
    z = (s_total - np.sign(s_total)) / np.sqrt(var_total)
    p = float(2 * stats.norm.sf(abs(z)))
    c = float(stats.norm.ppf(1 - alpha / 2)) * np.sqrt(var_total)
    lo_i = int(np.clip(np.floor((len(sl) - c) / 2), 0, len(sl) - 1))
    hi_i = int(np.clip(np.ceil((len(sl) + c) / 2), 0, len(sl) - 1))
    slope_rel, lo_rel, hi_rel = float(np.median(sl)), float(sl[lo_i]), float(sl[hi_i])
    span = float(np.ptp(t)) / 3600.0
    rel = slope_rel * span
    scale = abs(med_all)  # slopes shown in the series' unit, at its overall median
    excludes_zero_bad = lo_rel > 0 if bad_direction > 0 else hi_rel < 0
    drifting = excludes_zero_bad and p < alpha and abs(rel) >= min_change and np.sign(rel) == bad_direction
    return Trend(
        metric,
        n_total,
        slope_rel * scale,
        lo_rel * scale,
        hi_rel * scale,
        p,
        med_all,
        rel,
        bool(drifting),
        bad_direction,
    )
