"""A soak window's assembly, in three steps, from what the slice measured (pure functions: no clock, no I/O):

1. ``live_window`` when the window closes: the engine's counters over it, its memory, the load level, the health
   probe's longest silence, GPU and CPU use, all as they stood at its end;
2. ``settle_window`` when its requests have ended (SETTLE_WINDOWS later): the figures of the requests it streamed
   and ended (harness/soak/windows.py), their traffic, the work done since the engine started, the open-loop backlog;
3. ``judged_window`` once the change detector has seen it: its judgement, the detector state, the memory forecast.
   The result is the typed ``SoakWindow`` a line of windows.jsonl is written from.

Key order is the written order (windows.jsonl), which readers and old folders share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from engines.types import EngineCounters, acceptance_figures, counters_delta
from harness.detect.changepoint import ChangeDetector, DetectorSettings
from harness.probe.cpu import CpuUse
from harness.records.types import SoakWindow
from harness.soak.figures import engine_view, paused_s, stall_figures, work_done
from harness.soak.prefill import Ask, PrefillModel, ask_of, prefill_figures
from harness.soak.speed import Span, SpeedModel, span_of, speed_figures
from harness.soak.windows import Backlog, acceptance_sd, drafted_per_request, load_state, window_figures


def window_delta(before: EngineCounters | None, after: EngineCounters | None) -> EngineCounters | None:
    """The engine's counters over a window; its totals at the end when they fell (it restarted inside the window)."""
    if before is None or after is None:
        return None
    delta = counters_delta(before, after)
    if (delta.draft_tokens or 0) < 0 or (delta.accepted_tokens or 0) < 0 or (delta.output_tokens or 0) < 0:
        return after
    return delta


def live_window(
    *,
    config: str,
    slice_id: str,
    t0: float,
    t1: float,
    delta: EngineCounters | None,
    memory: dict[str, float | None],
    probe_latencies_s: Sequence[float],
    users: int | None,
    engine_pid: int | None,
    engine_uptime_s: float | None,
    engine_restart: bool,
    harness_rss_mib: float,
    machine_memory_available_mib: float,
    gpu: dict[str, Any],
    cpu: CpuUse | None,
    cpu_engine_restarted: bool,
    contamination_cores: float,
) -> dict[str, Any]:
    """The window's figures as they stood at its end ``t1`` (step 1). ``memory``: harness/soak/figures.py
    ``memory_figures``; ``users``: the closed-loop users throughout (None: they changed, or open loop); ``gpu``: the
    GPU sample; ``cpu``: the window's CPU split (None without a meter), ``cpu_engine_restarted`` when its engine
    process is not the one the meter started on."""
    acc = acceptance_figures(delta) if delta is not None else {"acceptance": None, "mean_accept_len": None}
    win: dict[str, Any] = {
        "config": config,
        "slice": slice_id,
        "t_start_unix": t0,
        "t_end_unix": t1,
        "t_unix": (t0 + t1) / 2,
        "acceptance": acc["acceptance"],
        "mean_accept_len": acc["mean_accept_len"],
        "counters": delta.to_dict() if delta is not None else None,
        **memory,
        "probe_max_s": max(probe_latencies_s) if probe_latencies_s else None,
        **engine_view(delta),
        "users": users,
        "engine_pid": engine_pid,
        "engine_uptime_s": engine_uptime_s,
        "engine_restart": engine_restart,
        "harness_rss_mib": harness_rss_mib,
        "machine_memory_available_mib": machine_memory_available_mib,
        "gpu": gpu,
        "gpu_used_mib": gpu["used_bytes"] / 2**20 if gpu.get("used_bytes") is not None else None,
        "gpu_total_mib": gpu["total_bytes"] / 2**20 if gpu.get("total_bytes") is not None else None,
        "engine_gpu_mib": gpu["process_bytes"] / 2**20 if gpu.get("process_bytes") is not None else None,
    }
    if cpu is not None:
        win["cpu"] = {**cpu.to_dict(), "engine_restarted": cpu_engine_restarted}
        win["engine_cores"] = cpu.engine_cores
        win["contaminated"] = cpu.contaminated(contamination_cores)
    else:
        win["contaminated"] = False
    return win


def settle_window(
    win: dict[str, Any],
    ended: Sequence[dict[str, Any]],
    streaming: Sequence[dict[str, Any]],
    previous: dict[str, Any] | None,
    counters: EngineCounters | None,
    traffic: dict[str, Any],
    open_loop: bool,
    outstanding_end: int | None = None,
    backlog: Backlog | None = None,
    intervals: Sequence[tuple[float, float]] = (),
    pauses: Sequence[tuple[float, float]] = (),
    spans: Sequence[Span] = (),
    speed: SpeedModel | None = None,
    learn_windows: int = 0,
    warming_up: bool = False,
    asks: Sequence[Ask] = (),
    prefill: PrefillModel | None = None,
) -> dict[str, Any]:
    """The window's request figures (step 2), added to ``win`` (returned). ``ended``: the records it takes (those that
    ended in it, or after an earlier window was judged); ``streaming``: the records not yet ended (they may have
    streamed in it); ``previous``: the configuration's last judged window (None: the first); ``counters``: the
    engine's totals at the window's end; ``traffic``: harness/load/pacing.py ``window_traffic``. Open loop:
    ``outstanding_end`` (the backlog at its end) and ``backlog`` (the slice's earlier windows, as load_state reads
    them) say whether the backlog held still; ``intervals``: (start, end) of the slice's recent requests (which of
    its requests ran alone); ``pauses``: the engine's silences at least the stall floor long, as (start, end), known
    by now (``paused_s``: how much of the window they cover, a pause that began in it and ended in the next included).
    ``spans``: the slice's recent requests' spans, ``speed``: the configuration's speed model (harness/soak/speed.py),
    learning from its first ``learn_windows`` clean windows; ``warming_up``: the change detector's warm-up (the model
    learns nothing from a cold engine); ``asks`` and ``prefill``: the same requests' first tokens, in order sent, and
    the configuration's prefill model (harness/soak/prefill.py), learning as the speed model does."""
    chunks = stall_figures(ended, [])
    win["paused_s"] = paused_s(pauses, win["t_start_unix"], win["t_end_unix"])
    win["max_chunk_gap_s"], win["itl_p99_s"] = chunks["max_chunk_gap_s"], chunks["itl_p99_s"]
    win.update(
        work_done(
            previous,
            ended,
            counters,
            restarted=bool(win.get("engine_restart"))
            or previous is None
            or previous.get("engine_pid") != win.get("engine_pid"),
        )
    )
    win.update(
        window_figures(
            ended, [*ended, *streaming], win["t_start_unix"], win["t_end_unix"], open_loop, win.get("users"), intervals
        )
    )
    win["count_sd"]["acceptance"] = acceptance_sd(
        win.get("acceptance"), (win.get("counters") or {}).get("draft_tokens"), drafted_per_request(ended)
    )
    if speed is not None:
        figures = speed_figures(win, spans, speed, learn_windows, warming_up)
        win["count_sd"]["speed_index"] = figures.pop("speed_index_sd")
        win.update(figures)
    if prefill is not None:
        figures = prefill_figures(win, asks, prefill, learn_windows, warming_up)
        win["count_sd"]["prefill_index"] = figures.pop("prefill_index_sd")
        win.update(figures)
    win.update(traffic)
    if open_loop:
        win["outstanding_end"] = outstanding_end
        win.update(load_state(backlog if backlog is not None else Backlog(), win))
    return win


def judged_window(
    win: dict[str, Any],
    judged: bool,
    not_judged_why: str | None,
    detectors: dict[str, Any],
    memory: tuple[float | None, float | None],
    gpu: tuple[float | None, float | None],
) -> SoakWindow:
    """The window once judged (step 3): the change detector's judgement and state per watched metric, and the
    memory forecasts ((headroom s, slope MiB/h) of the engine's memory and of the GPUs')."""
    win["judged"], win["not_judged_why"] = judged, not_judged_why
    win["detectors"] = detectors
    win["memory_headroom_s"], win["memory_slope_mib_per_h"] = memory
    win["gpu_headroom_s"], win["gpu_slope_mib_per_h"] = gpu
    return SoakWindow.from_dict(win)


def replay_speed(
    windows: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    settings: DetectorSettings,
    settle_s: float,
    phases: Sequence[dict[str, Any]] = (),
    slots: int | None = None,
) -> list[dict[str, Any]]:
    """One configuration's windows (a finished soak's windows.jsonl) with their speed index rebuilt from its request
    records, as the slice builds it: a window sees the records that had ended ``settle_s`` after its end, learns when
    the slice would have (the detector's warm-up, fed the same windows), and the detector is fed the result; each
    window carries the detector's judgement as the slice writes it (``judged``, ``not_judged_why``, ``detectors``).
    ``phases``: the configuration's measurement request records, where the curve starts as the campaign starts it.
    ``slots`` (the engine's, ``server.parallel``): the prefill index is rebuilt too (None: left as the window has it)."""
    det = ChangeDetector(settings)
    model = SpeedModel.from_phases(phases)
    pmodel = PrefillModel.from_phases(phases, slots) if slots is not None else None
    spans = sorted(((s.end, s) for r in records if (s := span_of(r)) is not None), key=lambda e: e[0])
    asks = sorted((a for r in records if (a := ask_of(r)) is not None), key=lambda a: a.start)
    reach = 2 * max((a.end - a.start for a in asks), default=0.0)  # the slice keeps asks ending this long before t0
    out = []
    for w in windows:
        if w.get("engine_restart"):
            det.engine_restarted()
        end = float(w["t_end_unix"]) + settle_s
        seen = [s for e, s in spans if e < end]
        warming_up = det.warming_up()
        figures = speed_figures(w, seen, model, settings.reference_windows, warming_up)
        win = {**w, "count_sd": {**(w.get("count_sd") or {}), "speed_index": figures.pop("speed_index_sd")}, **figures}
        if pmodel is not None:
            lo = float(w["t_start_unix"]) - reach
            pf = prefill_figures(
                w, [a for a in asks if lo <= a.end < end], pmodel, settings.reference_windows, warming_up
            )
            win["count_sd"]["prefill_index"] = pf.pop("prefill_index_sd")
            win.update(pf)
        det.update(win)
        judged, why = det.judged()
        out.append({**win, "judged": judged, "not_judged_why": why, "detectors": detector_states(det)})
    return out


def detector_states(det: ChangeDetector) -> dict[str, dict[str, Any]]:
    """The detector's per-metric state as a window record holds it."""
    return {m: asdict(st) for m, st in det.state().items()}
