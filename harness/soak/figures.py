"""What a soak window records beside its traffic: stalls, the engine's own view of load, memory as operators meet
it, and the work done since the engine started. Pure functions over a window's records and readings; no clock, no I/O.

Each of these answers a shape reported in the engines' trackers (docs/soak.md#what-the-watchdog-watches): pauses
that grow with uptime (a leaking dependency lengthening every GC pause), acceptance that decays with the KV cache's
state, memory that grows by design to a cap, or hides in swap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from engines.types import CacheState, EngineCounters, prefix_hit_rate
from harness.probe.memory import TreeMemory
from harness.records.types import SoakWindow


def stall_figures(records: Iterable[dict[str, Any]], probe_latencies_s: Sequence[float]) -> dict[str, float | None]:
    """The longest gap between two chunks of any request of the window, the p99 of all its chunk gaps, and the
    slowest health probe: a pause freezes every stream and the probe at once, and a window's median never shows it."""
    gaps: list[float] = []
    for r in records:
        itl = r.get("itl_s")
        if isinstance(itl, list):
            gaps.extend(float(g) for g in itl if isinstance(g, int | float))
    return {
        "max_chunk_gap_s": max(gaps) if gaps else None,
        "itl_p99_s": float(np.percentile(gaps, 99)) if gaps else None,
        "probe_max_s": max(probe_latencies_s) if probe_latencies_s else None,
    }


def longest_stall(window: Mapping[str, Any] | SoakWindow) -> float | None:
    """A window's longest pause of the whole engine: the health probe's longest silence. A stream's longest chunk gap
    is recorded beside it but is no pause of the engine by itself: llama-server processes a new request's prompt in
    one batch, so a 3,000-token prompt holds every other stream 7-11 s on 2 cores while /health answers at once."""
    v = window.get("probe_max_s")
    return float(v) if isinstance(v, int | float) else None


def paused_s(pauses: Iterable[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of ``[t0, t1)`` the engine was silent in ``pauses`` ((start, end) spans, harness/soak/health.py
    ``HealthProbe.pauses``), overlapping spans counted once: a pause that straddles two windows is in both."""
    cut = sorted((max(a, t0), min(b, t1)) for a, b in pauses if b > t0 and a < t1)
    total, reach = 0.0, t0
    for a, b in cut:
        total += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    return total


def stall_to_flag(window: Mapping[str, Any] | SoakWindow, floor_s: float, flagged_s: float) -> float | None:
    """The pause a ``stall`` verdict names for this window, or None: the engine's longest pause in it (the probe's
    silence) when it reaches the floor and is at least half again the longest already named on this engine
    (``flagged_s``, 0 for none)."""
    stall = longest_stall(window)
    if stall is None or stall < floor_s or stall < 1.5 * flagged_s:
        return None
    return stall


def engine_view(delta: EngineCounters | None) -> dict[str, float | None]:
    """The engine's own view of load in a window, from the /metrics delta (gauges as at the window's end)."""
    if delta is None:
        return {
            "requests_running": None,
            "requests_waiting": None,
            "kv_usage": None,
            "preemptions": None,
            "prefix_hit_rate": None,
        }
    return {
        "requests_running": delta.requests_processing,
        "requests_waiting": delta.requests_deferred,
        "kv_usage": delta.kv_usage,
        "preemptions": delta.preemptions,
        "prefix_hit_rate": prefix_hit_rate(delta),
    }


def memory_figures(mem: TreeMemory | None, cache: CacheState | None) -> dict[str, float | None]:
    """The engine tree's memory: resident, anonymous + swapped, the prompt cache's share as the engine logs it, and
    ``engine_memory_mib``, the larger of RSS and anonymous + swapped net of that cache (what the collapse detector
    and the drift test watch: a cache filling to its cap by design is reported as cache growth, not as a leak)."""
    cache_mib = cache.size_mib if cache is not None else None
    out: dict[str, float | None] = {
        "engine_rss_mib": mem.rss_mib if mem is not None else None,
        "engine_anon_mib": mem.anon_mib if mem is not None else None,
        "engine_swap_mib": mem.swap_mib if mem is not None else None,
        "prompt_cache_mib": cache_mib,
        "prompt_cache_prompts": float(cache.prompts) if cache is not None else None,
        "prompt_cache_cap_mib": cache.cap_mib if cache is not None else None,
        "engine_memory_mib": None,
    }
    if mem is not None:
        out["engine_memory_mib"] = max(0.0, mem.held_mib - (cache_mib or 0.0))
    return out


@dataclass(frozen=True)
class CacheOutlook:
    """Where a prompt cache is heading: the room it may still take, and whether that fits."""

    size_mib: float
    cap_mib: float | None
    room_mib: float | None  # cap - size; None without a cap
    fits: bool  # the cache can reach its cap with memory to spare
    slope_mib_per_h: float | None
    runs_out_s: float | None  # at that slope, seconds until available memory is gone (only when it does not fit)


def cache_outlook(
    points: Sequence[tuple[float, float]], cap_mib: float | None, available_mib: float, margin: float = 0.1
) -> CacheOutlook | None:
    """The prompt cache's outlook from (t_unix, size MiB) points: growth toward a cap that fits in the memory still
    available (less ``margin`` of it) is by design; a cap that does not fit runs out of memory at the cache's growth
    rate (Theil-Sen over the points, None with fewer than 3)."""
    if not points:
        return None
    size = points[-1][1]
    room = None if cap_mib is None or cap_mib < 0 else max(0.0, cap_mib - size)
    fits = room is not None and room <= (1 - margin) * max(0.0, available_mib)
    slope = None
    if len(points) >= 3 and np.ptp([p[0] for p in points]) > 0:
        t = np.asarray([p[0] for p in points], dtype=float)
        slope = float(stats.theilslopes([p[1] for p in points], (t - t.min()) / 3600.0).slope)
    runs_out = None
    if not fits and slope is not None and slope > 0:
        runs_out = max(0.0, available_mib) / (slope / 3600.0)
    return CacheOutlook(size, cap_mib, room, fits, slope, runs_out)


def stall_trend(windows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(longest stall of the soak, Theil-Sen slope of each window's longest stall over engine uptime in s/h): the
    shape of pauses that lengthen with uptime. (None, None) without stalls; slope None with fewer than 6 windows."""
    raw = [(w.get("engine_uptime_s"), longest_stall(w)) for w in windows]
    pts = [(float(u), float(s)) for u, s in raw if isinstance(u, int | float) and s is not None]
    if not pts:
        return None, None
    worst = max(s for _, s in pts)
    if len(pts) < 6 or np.ptp([p[0] for p in pts]) <= 0:
        return worst, None
    res = stats.theilslopes([p[1] for p in pts], [p[0] / 3600.0 for p in pts])
    return worst, float(res.slope)


def work_done(
    prev: dict[str, Any] | None, records: Sequence[dict[str, Any]], counters: EngineCounters | None, restarted: bool
) -> dict[str, float]:
    """Requests and output tokens the engine has served since it started: its own cumulative counters where it has
    them, else the harness's count carried from the previous window (reset when the engine restarted)."""
    ok = [r for r in records if r.get("status") == "ok"]
    base_req = 0.0 if restarted or prev is None else float(prev.get("engine_requests_done") or 0.0)
    base_tok = 0.0 if restarted or prev is None else float(prev.get("engine_output_tokens_done") or 0.0)
    requests = base_req + len(records)
    tokens = base_tok + sum(float(r.get("output_tokens") or 0) for r in ok)
    if counters is not None and counters.requests_finished is not None:
        requests = counters.requests_finished
    if counters is not None and counters.output_tokens is not None:
        tokens = counters.output_tokens
    return {"engine_requests_done": requests, "engine_output_tokens_done": tokens}
