"""The watchdog's rules over a judged window: which verdicts it gives, decided from the windows and the scenario's
``soak.watchdog`` settings alone (no clock but the one passed in, no I/O), so a test or a benchmark can feed them
windows without an engine. harness/soak/slice.py writes the verdicts these rules return and acts on them.

Rules, in the order a window's verdicts are given: the change detector's events (``collapse`` / ``recovered``),
``stall``, the prompt cache (``cache_cap``, ``memory``), the engine's and the GPU's memory forecast (``memory``),
``disk``, ``error_rate``, ``drift``, and in an open loop ``overload`` (or ``collapse`` of ``served_rps``: a rate the
engine served earlier in the soak and no longer does), judged on every window whatever its backlog.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness.config.schema import Watchdog
from harness.detect.changepoint import WATCHED_CHANGES, ChangeEvent, memory_forecast
from harness.detect.trend import WATCHED, trend
from harness.load.schedule import LEVEL_STEP
from harness.records.types import SoakWindow
from harness.soak.figures import cache_outlook, stall_to_flag
from harness.soak.windows import load_key

# what another process's CPU can cost a CPU engine: the share of its speed lost over the share of the CPU in use the
# other process took (threads that wait on each other lose more than it takes): llama-server's solo decode lost 37% to
# a third of a core taken and 76% to two thirds on this 2-core VM, 2.23 and 2.29 (bench/cpu_cost.py, 2026-12-07)
CPU_AMPLIFICATION = 2.25
# the figures judged against this engine's own model, at any load: what the lost CPU explains is weighed for them
INDEX_METRICS = ("speed_index", "prefill_index")
RSS_TREND_AFTER_S = 600.0  # the slow RSS trend ignores the engine's first 10 minutes (warm-up growth is not a leak)
# figures a window carries only in some soaks: in its evidence where it has one (open loop: harness/soak/windows.py)
BRIEF_IF_SET = ("alone_decode_tps", "speed_index", "prefill_index")
# the figures of a window that verdict evidence carries (not the detector state nor the CPU detail)
BRIEF_KEYS = (
    "t_start_unix",
    "t_end_unix",
    "requests",
    "errors",
    "output_tps",
    "decode_tps",
    "ttft_p95_s",
    "error_ratio",
    "acceptance",
    "engine_rss_mib",
    "engine_memory_mib",
    "engine_anon_mib",
    "prompt_cache_mib",
    "users",
    "engine_uptime_s",
    "contaminated",
    "achieved_rps",
    "goodput_rps",
    "offered_rps",
    "late",
    "load_level",
    "max_chunk_gap_s",
    "probe_max_s",
    "requests_waiting",
    "kv_usage",
    "prefix_hit_rate",
    "engine_requests_done",
    "engine_output_tokens_done",
    "outstanding_end",
    "draining",
    "load_settled",
)

Window = Mapping[str, Any]  # a window as written (windows.jsonl): the history the rules look back over


@dataclass(frozen=True)
class Finding:
    """A verdict a rule gives: ``action`` None takes the scenario's action for the kind."""

    kind: str
    message: str
    evidence: dict[str, Any]
    metric: str | None = None
    action: str | None = None


@dataclass
class WatchState:
    """What the rules remember on one engine: the pids already warned about memory, GPU memory and the prompt cache,
    the longest stall already named, and the metrics a drift verdict already named (for the whole soak)."""

    memory_warned_pid: int | None = None
    gpu_warned_pid: int | None = None
    cache_warned_pid: int | None = None
    stall_flagged_s: float = 0.0
    drift_flagged: set[str] = field(default_factory=set)
    overload_flagged: set[Any] = field(default_factory=set)  # (engine pid, load level) an overload was named at

    def engine_restarted(self) -> None:
        """A new engine process: its memory, cache, stalls and overloads are judged afresh (drift is over the soak)."""
        self.memory_warned_pid = self.gpu_warned_pid = self.cache_warned_pid = None
        self.stall_flagged_s = 0.0
        self.overload_flagged = set()


def brief(w: SoakWindow | Window) -> dict[str, Any]:
    """A window as verdict evidence: its figures, without the detector state and CPU detail."""
    out = {k: w.get(k) for k in BRIEF_KEYS}
    out.update({k: v for k in BRIEF_IF_SET if (v := w.get(k)) is not None})
    return out


def available_mib(win: SoakWindow | Window, memory_limit_mib: float | None) -> float:
    """Memory the engine can still take: the machine's available memory, or less under ``memory_limit_mib``."""
    available = float(win.get("machine_memory_available_mib") or 0.0)
    if memory_limit_mib is not None:
        held = max(float(win.get("engine_rss_mib") or 0.0), float(win.get("engine_anon_mib") or 0.0))
        available = min(available, max(0.0, memory_limit_mib - held))
    return available


def headroom(
    history: Sequence[Window], win: SoakWindow | Window, wd: Watchdog, gpu: bool = False
) -> tuple[float | None, float | None]:
    """(seconds until available memory runs out at the engine's memory slope over the last memory_fit_s, that slope
    in MiB/h), this engine process only; (None, slope) when it does not grow, (None, None) before there is a forecast.
    ``gpu``: the GPUs' used memory against their free memory instead (None without NVML). ``history``: the
    configuration's earlier windows; ``win`` is the one being judged."""
    pid = win.get("engine_pid")
    t_unix = float(win.t_unix if isinstance(win, SoakWindow) else win["t_unix"])
    key = "gpu_used_mib" if gpu else "engine_memory_mib"
    pts = [
        (float(w["t_unix"]), float(w[key]))
        for w in history
        if w.get("engine_pid") == pid and w.get(key) is not None and w["t_unix"] >= t_unix - wd.memory_fit_s
    ]
    if (now := win.get(key)) is not None:
        pts.append((t_unix, float(now)))
    if len(pts) < 3:
        return None, None
    if gpu:
        total, used = win.get("gpu_total_mib"), win.get("gpu_used_mib")
        if total is None or used is None:
            return None, None  # no GPU figure in this window: no forecast against it
        available = float(total) - float(used)
    else:
        available = available_mib(win, wd.memory_limit_mib)
    fc = memory_forecast(
        [p[0] for p in pts], [p[1] for p in pts], available, min_span_s=min(600.0, wd.memory_fit_s / 2)
    )
    return (fc.headroom_s, fc.slope_mib_per_h) if fc is not None else (None, None)


def change_finding(ev: ChangeEvent, history: Sequence[Window], wd: Watchdog, open_loop: bool) -> Finding:
    """The change detector's event as a ``collapse`` or ``recovered`` verdict. ``history`` ends with the window judged."""
    evidence = {**ev.to_dict(), "windows": [brief(w) for w in history[-(wd.confirm_windows + 2) :]]}
    change = f"{ev.relative_change:+.0%}" if ev.metric != "error_ratio" else f"{ev.relative_change:+.2f}"
    if ev.kind == "collapse":
        # confirmed in windows where other processes took the CPU: said, and recorded rather than acted on
        busy = [w for w in history[-wd.confirm_windows :] if w.get("contaminated")]
        other = max((float((w.get("cpu") or {}).get("other_cores") or 0.0) for w in busy), default=0.0)
        steal = max((float((w.get("cpu") or {}).get("steal_cores") or 0.0) for w in busy), default=0.0)
        lost = lost_cpu(ev, history, wd.confirm_windows, busy)
        unexplained = lost is not None and lost.unexplained
        # a rule judged at any load (the speed index) has no level, in either loop
        at = (
            "any load level"
            if ev.level is None
            else f"{ev.level} users"
            if not open_loop
            else f"load level {ev.level} (about {LEVEL_STEP**ev.level:.3g} rps)"
        )
        # judged against its prior (1 on the engine's curve) before the soak had its own reference: the soak's requests
        # may decode slower than those the curve learned (longer contexts, other prompts), so it is said and recorded
        early = ev.prior and not busy
        # the curve began on the measurement phases, or (none recorded) on the soak's own first learned windows
        phases = ((history[-1].get("speed") or {}).get("model") or {}).get("phases") if history else None
        drew = "the measurement" if phases else "the soak's first learned windows"
        return Finding(
            "collapse",
            f"{ev.metric} {change} against its reference {ev.reference:.3g} at {at} "
            f"(now {ev.value:.3g}), since {time.strftime('%H:%M:%S', time.localtime(ev.onset_unix))}"
            + (
                f"; other processes took up to {other:.2f} cores"
                + (f" and the hypervisor up to {steal:.2f} (steal)" if steal >= 0.005 else "")
                + f" in {len(busy)} of its last {wd.confirm_windows} windows"
                + (
                    f", which explains at most {lost.explained:.0%} of a slowdown, not this one ({lost.ratio:.3g} of "
                    "its reference in those windows)"
                    if lost is not None and unexplained
                    else ", so it is recorded, not acted on"
                )
                if busy
                else ""
            )
            + (
                f"; from the soak's first windows, against the curve {drew} drew (the soak had no reference "
                "of its own yet: its requests may decode slower than those the curve learned), so it is recorded, not "
                "acted on"
                if early
                else ""
            ),
            {
                **evidence,
                "contaminated_windows": len(busy),
                **({"lost_cpu": {"ratio": lost.ratio, "explained": lost.explained}} if lost is not None else {}),
            }
            if busy
            else evidence,
            metric=ev.metric,
            action="record" if (busy and not unexplained) or early else None,
        )
    return Finding(
        "recovered",
        f"{ev.metric} back near its reference after {(ev.episode_end_unix or 0) - (ev.episode_start_unix or 0):.0f} s "
        f"(worst {ev.size:+.2g})",
        evidence,
        metric=ev.metric,
        action="record",
    )


def _cpu_used(w: Window) -> tuple[float, float]:
    """(cores other processes and the hypervisor took, cores in use in all) in a window's CPU split."""
    cpu = w.get("cpu") or {}
    lost = float(cpu.get("other_cores") or 0.0) + float(cpu.get("steal_cores") or 0.0)
    return lost, lost + float(cpu.get("engine_cores") or 0.0) + float(cpu.get("harness_cores") or 0.0)


class LostCpu(NamedTuple):
    ratio: float  # the confirm windows' median index over its reference
    explained: float  # the largest share of speed the CPU taken explains
    unexplained: bool  # the slowdown is larger than that and still clears the rule's own gate beside it


def lost_cpu(
    ev: ChangeEvent, history: Sequence[Window], confirm_windows: int, busy: Sequence[Window]
) -> LostCpu | None:
    """A slowdown of the speed or prefill index confirmed in contaminated windows, against what the CPU other processes
    (and the hypervisor) took can explain. A slowdown the lost CPU cannot explain is acted on; one it can is recorded.
    None for another metric or no CPU split. (The amplification was measured on decode; prefill is taken to lose as
    much.)
    The share: the cores taken over the most cores in use in any window of the soak so far (the machine a CPU engine
    fills; not the window's own total, which a slowed engine lowers), times CPU_AMPLIFICATION, measured against a
    quiet machine, so it is an upper bound where the curve was drawn on an equally busy one."""
    if ev.metric not in INDEX_METRICS or not busy or ev.reference <= 0:
        return None
    capacity = max((_cpu_used(w)[1] for w in history), default=0.0)
    if capacity <= 0:
        return None
    values = [float(w[ev.metric]) for w in history[-confirm_windows:] if w.get(ev.metric) is not None] or [ev.value]
    ratio = statistics.median(values) / ev.reference
    explained = min(1.0, CPU_AMPLIFICATION * max(_cpu_used(w)[0] for w in busy) / capacity)
    gate = WATCHED_CHANGES[ev.metric].min_change
    return LostCpu(round(ratio, 4), round(explained, 4), ratio < (1.0 - explained) * (1.0 - gate))


def stall_rule(win: SoakWindow, wd: Watchdog, state: WatchState) -> Finding | None:
    """A ``stall`` verdict when the health probe waited past ``stall_warn_s``, and again each time the longest pause
    grows by half (pauses that lengthen with uptime: each a line, long before a request fails). Contaminated windows
    are not judged, as in the change detector: other processes took the CPU, a pause then is the machine's."""
    if win.contaminated:
        return None
    stall = stall_to_flag(win, wd.stall_warn_s, state.stall_flagged_s)
    if stall is None:
        return None
    state.stall_flagged_s = stall
    gap = win.max_chunk_gap_s
    return Finding(
        "stall",
        f"the engine did not answer its health probe for {stall:.1f} s (floor {wd.stall_warn_s:g} s)"
        + (f"; longest gap between two chunks of a stream {gap:.1f} s" if isinstance(gap, int | float) else ""),
        {"window": brief(win), "longest_stall_s": stall, "onset_unix": win.t_start_unix},
        metric="longest_stall_s",
    )


def cache_rules(win: SoakWindow, history: Sequence[Window], wd: Watchdog, state: WatchState) -> list[Finding]:
    """The prompt cache: growth toward a cap that fits is by design (the report names it); a cap that does not fit
    is a ``cache_cap`` warning once per engine, and a ``memory`` verdict when its growth will use up the memory left.
    ``history`` ends with the window judged."""
    pid = win.engine_pid
    pts = [
        (w["t_unix"], w["prompt_cache_mib"])
        for w in history
        if w.get("engine_pid") == pid
        and w.get("prompt_cache_mib") is not None
        and w["t_unix"] >= win.t_unix - wd.memory_fit_s
    ]
    cap = win.prompt_cache_cap_mib
    if not pts:
        return []
    available = available_mib(win, wd.memory_limit_mib)
    out = cache_outlook(pts, cap, available)
    if out is None or out.fits:
        return []
    found = []
    if state.cache_warned_pid != pid:
        state.cache_warned_pid = pid
        found.append(
            Finding(
                "cache_cap",
                f"the engine's prompt cache may grow to {'no limit' if cap is None or cap < 0 else f'{cap:,.0f} MiB'} "
                f"({out.size_mib:,.0f} MiB now) but only {available:,.0f} MiB is available",
                {"window": brief(win), "cap_mib": cap, "size_mib": out.size_mib, "available_mib": available},
                metric="prompt_cache_mib",
                action="record",
            )
        )
    if out.runs_out_s is not None and out.runs_out_s < wd.memory_horizon_s and state.memory_warned_pid != pid:
        state.memory_warned_pid = pid
        found.append(
            Finding(
                "memory",
                f"the prompt cache grows {out.slope_mib_per_h:,.0f} MiB/h toward a cap that does not fit: "
                f"available memory ({available:,.0f} MiB) runs out in {out.runs_out_s / 60:.0f} min",
                # the growth's onset: the end of the first window of the fit (what it grew from)
                {
                    "window": brief(win),
                    "headroom_s": out.runs_out_s,
                    "cap_mib": cap,
                    "size_mib": out.size_mib,
                    "onset_unix": next(w["t_end_unix"] for w in history if w["t_unix"] == pts[0][0]),
                },
                metric="prompt_cache_mib",
            )
        )
    return found


def memory_rules(win: SoakWindow, wd: Watchdog, state: WatchState) -> list[Finding]:
    """A ``memory`` verdict, once per engine, when the window's forecast (``memory_headroom_s``, ``gpu_headroom_s``)
    says available memory or GPU memory runs out within ``memory_horizon_s``."""
    found = []
    pid = win.engine_pid
    if (
        win.memory_headroom_s is not None
        and win.memory_headroom_s < wd.memory_horizon_s
        and state.memory_warned_pid != pid
    ):
        state.memory_warned_pid = pid
        found.append(
            Finding(
                "memory",
                f"at the engine's memory slope ({win.memory_slope_mib_per_h or 0:+,.0f} MiB/h, prompt cache left out), "
                f"available memory ({available_mib(win, wd.memory_limit_mib):,.0f} MiB) runs out in {win.memory_headroom_s / 60:.0f} min",
                {"window": brief(win), "headroom_s": win.memory_headroom_s},
                metric="engine_memory_mib",
            )
        )
    if win.gpu_headroom_s is not None and win.gpu_headroom_s < wd.memory_horizon_s and state.gpu_warned_pid != pid:
        state.gpu_warned_pid = pid
        free = (win.gpu_total_mib or 0.0) - (win.gpu_used_mib or 0.0)
        found.append(
            Finding(
                "memory",
                f"at the GPU memory slope ({win.gpu_slope_mib_per_h or 0:,.0f} MiB/h), GPU memory "
                f"({free:,.0f} MiB free) runs out in {win.gpu_headroom_s / 60:.0f} min",
                {"window": brief(win), "headroom_s": win.gpu_headroom_s},
                metric="gpu_used_mib",
            )
        )
    return found


def disk_rule(win: SoakWindow, short: tuple[str, dict[str, Any]] | None) -> Finding | None:
    """A ``disk`` verdict from the results disk's check of this window (harness/soak/disk.py ``DiskWatch.check``)."""
    if short is None:
        return None
    return Finding("disk", short[0], {**short[1], "window": brief(win)})


def error_rate_rule(win: SoakWindow, wd: Watchdog) -> Finding | None:
    """An ``error_rate`` verdict when at least ``min_requests`` ended in the window and their failed share reached
    ``error_rate``."""
    if win.requests >= wd.min_requests and win.errors / win.requests >= wd.error_rate:
        return Finding(
            "error_rate", f"{win.errors} of {win.requests} requests failed in the last window", {"window": brief(win)}
        )
    return None


# a collapse of the served rate: the engine now sustains under this share of a rate it served earlier in the soak
SERVED_SHORTFALL = 0.25


def _seconds(w: Window) -> float:
    return max(0.0, float(w["t_end_unix"]) - float(w["t_start_unix"]))


def overload_rule(history: Sequence[Window], wd: Watchdog, state: WatchState) -> Finding | None:
    """Open loop, on every window whatever its backlog: over the last ``overload_windows`` windows at one load level
    (one engine, none draining), a queue that kept growing, by more than the Poisson arrivals wander (2 sqrt(arrivals)
    + 1) and past one window's arrivals, means the engine serves less than it is offered. An ``overload`` (default
    ``record``: a finding about the rate, not a failure) naming the offered rate and the rate it sustained; a
    ``collapse`` of ``served_rps`` instead when earlier in the soak the engine served this rate or a higher one with a
    backlog that held still, and now sustains less than (1 - SERVED_SHORTFALL) of it by more than three Poisson sds
    (an engine near its capacity queues by chance, at about the rate it is asked); recorded, not acted on, when other
    processes took the CPU in one of those windows. Once per level and engine.
    ``history`` ends with the window judged."""
    n = wd.overload_windows
    span = list(history[-n:])
    last = span[-1] if span else None
    if last is None or len(span) < n:
        return None
    level, pid = last.get("load_level"), last.get("engine_pid")
    if level is None or (pid, level) in state.overload_flagged:
        return None
    if any(
        w.get("load_level") != level or w.get("engine_pid") != pid or w.get("outstanding_end") is None for w in span
    ):
        return None
    queue = [int(w["outstanding_end"]) for w in span]
    arrivals = sum(int(w.get("scheduled") or 0) for w in span[1:])
    sched = int(last.get("scheduled") or 0)
    rose = queue[-1] - queue[0] > 2 * math.sqrt(arrivals) + 1 and queue[-1] == max(queue)
    if not rose or queue[-1] <= sched + 2 * math.sqrt(sched) + 1 or any(w.get("draining") for w in span):
        return None
    secs = sum(_seconds(w) for w in span)
    if secs <= 0:
        return None
    served = sum(float(w.get("achieved_rps") or 0.0) * _seconds(w) for w in span) / secs
    offered = sum(float(w.get("offered_rps") or 0.0) * _seconds(w) for w in span) / secs
    asked = float(last.get("asked_rps") or offered)
    late = sum(int(w.get("late") or 0) for w in span)
    busy = sum(bool(w.get("contaminated")) for w in span)
    state.overload_flagged.add((pid, level))
    evidence: dict[str, Any] = {
        "load_level": level,
        "asked_rps": asked,
        "offered_rps": offered,
        "served_rps": served,
        "backlog": queue,
        "late": late,
        "contaminated_windows": busy,
        "onset_unix": span[0]["t_start_unix"],
        "windows": [brief(w) for w in span],
    }
    queued = f"its queue grew {queue[0]} → {queue[-1]} over {n} windows, {late} late sends"
    also = f"; other processes took the CPU in {busy} of these windows" if busy else ""
    earlier = [
        w
        for w in history[:-n]
        if w.get("load_settled") and w.get("achieved_rps") and float(w.get("asked_rps") or 0.0) >= asked / 1.05
    ]
    if earlier:
        before = sum(float(w["achieved_rps"]) * _seconds(w) for w in earlier) / sum(_seconds(w) for w in earlier)
        served_then = min(asked, before)
        expected = served_then * secs
        if served < (1 - SERVED_SHORTFALL) * served_then and expected - served * secs > 3 * math.sqrt(expected):
            change = served / served_then - 1
            evidence.update(served_before_rps=served_then, relative_change=change, reference=served_then)
            return Finding(
                "collapse",
                f"served_rps {change:+.0%}: the engine sustains {served:.3g} rps at about {asked:.3g} rps asked, a rate "
                f"it served earlier in this soak ({served_then:.3g} rps, backlog held still); {queued}{also}"
                + (": recorded, not acted on" if busy else ""),
                evidence,
                metric="served_rps",
                # other processes took the CPU meanwhile: the machine may be what slowed, so it is said, not acted on
                action="record" if busy else None,
            )
    return Finding(
        "overload",
        f"the engine serves {served:.3g} rps of the {offered:.3g} rps offered (about {asked:.3g} rps asked): {queued}"
        + also,
        evidence,
        metric="served_rps",
    )


def overload_cell(v: dict[str, Any]) -> str:
    """An ``overload`` verdict in a few words: the rate asked, what the engine sustained of what was offered."""
    ev = v.get("evidence") or {}
    asked, served, offered = ev.get("asked_rps"), ev.get("served_rps"), ev.get("offered_rps")
    if not all(isinstance(x, int | float) for x in (asked, served, offered)):
        return str(v.get("message", "overload"))
    return f"~{asked:.3g} rps: served {served:.3g} of {offered:.3g} offered"


def drift_points(wins: Sequence[Window], metric: str) -> list[tuple[float, float, Any]]:
    """(t_unix, value, load level) of the windows the drift test takes: not contaminated, engine memory only after the
    engine's first 10 minutes and at one level (memory does not follow the load), a series the change detector judges
    at every level at one level (the decode of requests that ran alone: the engine's own speed), the rest at their
    load level (harness/soak/windows.py ``load_key``), open-loop windows only where the backlog held still."""
    out: list[tuple[float, float, Any]] = []
    rule = WATCHED_CHANGES.get(metric)
    for w in wins:
        if w.get(metric) is None or w.get("contaminated"):
            continue
        if metric == "engine_memory_mib":
            if (w.get("engine_uptime_s") or 0) >= RSS_TREND_AFTER_S:
                out.append((w["t_unix"], w[metric], None))
            continue
        if rule is not None and not rule.per_level:
            out.append((w["t_unix"], w[metric], None))
            continue
        level = load_key(w)
        if (("load_level" in w or "users" in w) and level is None) or w.get("load_settled") is False:
            continue
        out.append((w["t_unix"], w[metric], level))
    return out


def drift_rules(history: Sequence[Window], wd: Watchdog, state: WatchState, open_loop: bool = False) -> list[Finding]:
    """A ``drift`` verdict, once per metric and soak, when a watched series trends over the whole soak
    (harness/detect/trend.py); a series only in the soaks its change rule judges (per-request decode t/s in a closed
    loop, the decode of requests that ran alone in an open one: an open loop's per-request decode follows how many
    requests happened to share the engine, and the third two-hour soak's fell 49% over its staged hour)."""
    if len(history) < wd.drift_min_windows:
        return []
    loop = "open" if open_loop else "closed"
    found = []
    for metric, bad in WATCHED.items():
        rule = WATCHED_CHANGES.get(metric)
        if metric in state.drift_flagged or (rule is not None and rule.loop not in (None, loop)):
            continue
        pts = drift_points(history, metric)
        if len(pts) < wd.drift_min_windows or pts[-1][0] - pts[0][0] < wd.drift_min_span_s:
            continue
        tr = trend(
            metric,
            [p[0] for p in pts],
            [p[1] for p in pts],
            bad,
            wd.drift_alpha,
            wd.drift_min_change,
            [p[2] for p in pts],
        )
        if tr is not None and tr.drifting:
            state.drift_flagged.add(metric)
            found.append(
                Finding(
                    "drift",
                    f"{metric} {'rises' if bad > 0 else 'falls'} {abs(tr.relative_change):.0%} over the soak "
                    f"(Theil-Sen {tr.slope_per_hour:+.3g}/h, CI [{tr.slope_low_per_hour:+.3g}, {tr.slope_high_per_hour:+.3g}], p={tr.p_value:.2g})",
                    tr.to_dict(),
                    metric=metric,
                )
            )
    return found


def judge(
    win: SoakWindow,
    history: Sequence[Window],
    wd: Watchdog,
    state: WatchState,
    events: Sequence[ChangeEvent],
    disk_short: tuple[str, dict[str, Any]] | None,
    open_loop: bool,
) -> list[Finding]:
    """Every verdict a judged window gives, in order. ``history``: the configuration's windows, ending with this one
    as written; ``events``: the change detector's for it; ``disk_short``: the disk check's for it."""
    found: list[Finding] = [change_finding(ev, history, wd, open_loop) for ev in events]
    rules: list[Callable[[], Finding | list[Finding] | None]] = [
        lambda: stall_rule(win, wd, state),
        lambda: cache_rules(win, history, wd, state),
        lambda: memory_rules(win, wd, state),
        lambda: disk_rule(win, disk_short),
        lambda: error_rate_rule(win, wd),
        lambda: drift_rules(history, wd, state, open_loop),
        lambda: overload_rule(history, wd, state) if open_loop else None,
    ]
    for rule in rules:
        got = rule()
        if isinstance(got, list):
            found.extend(got)
        elif got is not None:
            found.append(got)
    return found
