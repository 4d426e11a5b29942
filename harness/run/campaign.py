"""The soak campaign: each soaked configuration's hours of traffic (one engine for its whole soak, or alternating
slices on fresh engines), the measured phases again on the soaked engine, and the verdicts that decide which failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.common.errors import EngineError
from harness.common.net import free_port
from harness.config.policy import verdict_fails
from harness.config.schema import Configuration, safe_name
from harness.records.files import AFTER_SOAK, REQUESTS, WINDOWS, read_jsonl
from harness.records.files import VERDICTS as VERDICTS_FILE
from harness.run.manifest import RunState
from harness.run.outputs import NotifyingWriter
from harness.run.progress import Progress
from harness.session.engine import EngineSession, RunContext
from harness.soak.coverage import coverage
from harness.soak.watchdog import overload_cell


def soak_campaign(
    ctx: RunContext,
    state: RunState,
    progress: Progress,
    failures: NotifyingWriter,
    failed: list[str],
    after_soak: Callable[[Configuration, EngineSession], None],
) -> tuple[list[str], str | None]:
    """Each configuration's soak; returns the configurations whose soak failed, and why the run was stopped (if it was).

    Default: one engine process per configuration for its whole soak, then the measurement phases
    again on that aged engine (``after_soak``, into ``after_soak.jsonl``: the report's before/after). With ``slice_s``
    the configurations alternate, each slice on a fresh engine."""
    from harness.soak.prefill import PrefillModel
    from harness.soak.slice import SoakSlice, load_history, replay_detector, soak_elapsed
    from harness.soak.speed import SpeedModel

    sc, run_dir, console = ctx.sc, ctx.run_dir, ctx.console
    assert sc.soak is not None
    soak = sc.soak
    cfgs = [c for c in sc.soak_configurations() if c.name not in failed]
    elapsed, n_slices = soak_elapsed(run_dir)
    history = load_history(run_dir)
    detectors = {c.name: replay_detector(soak.watchdog, history.get(c.name, [])) for c in cfgs}
    # each configuration's speed curve: from its measurement phases on fresh engines, then its first soak windows of
    # this process (a resumed soak too)
    measured = [r for r in read_jsonl(run_dir / REQUESTS) if r.get("config") in {c.name for c in cfgs}]
    speeds = {c.name: SpeedModel.from_phases(r for r in measured if r["config"] == c.name) for c in cfgs}
    # and its prefill model (harness/soak/prefill.py): the service its first tokens take once a slot is theirs
    prefills = {
        c.name: PrefillModel.from_phases((r for r in measured if r["config"] == c.name), sc.server.parallel)
        for c in cfgs
    }
    soak_streams = min(sc.server.parallel, soak.peak_streams())  # the most streams the soak can have decoding
    for name, model in speeds.items():
        if model.t1 is not None:
            console.print(
                f"{name}: speed curve from {model.phases} measurement phases: one stream {model.t1:.1f} t/s"
                + (f", {model.k_max} streams learned" if model.k_max > 1 else ""),
                highlight=False,
            )
            if model.k_max < soak_streams:
                console.print(
                    f"[yellow]{name}: the soak can decode {soak_streams} streams at once and the measurement measured "
                    f"{model.k_max}: past {model.k_max} the curve is a lower bound, and a slowdown first met at a level "
                    f"never measured can read as that level's speed (add {soak_streams} to measurement.streams)[/]",
                    highlight=False,
                )
    ports = {c.name: free_port() for c in cfgs}
    slice_len = soak.slice_s or soak.duration_s
    stopped: dict[str, str] = {}  # config -> why its soak was ended by a verdict
    earlier = list(read_jsonl(run_dir / VERDICTS_FILE))  # a resumed run: what verdicts already stopped
    for v in earlier:
        if v.get("action") in ("stop_config", "stop_run") and v.get("config") in detectors:
            stopped.setdefault(v["config"], f"{v.get('kind')}: {v.get('message')}")
    stop_run = next((f"{v.get('config')}: {v.get('kind')}" for v in earlier if v.get("action") == "stop_run"), None)
    state.manifest.extra["soak"] = {
        "duration_s": soak.duration_s,
        "configurations": [c.name for c in cfgs],
        "design": "interleaved slices, engine restarted per slice"
        if soak.slice_s
        else "one engine per configuration for its whole soak",
    }
    state.write()
    while stop_run is None:
        todo = [c for c in cfgs if soak.duration_s - elapsed.get(c.name, 0.0) > 1.0 and c.name not in stopped]
        if not todo:
            break
        for cfg in todo:
            remaining = soak.duration_s - elapsed.get(cfg.name, 0.0)
            length = min(slice_len, remaining)
            n_slices += 1
            slice_id = f"{safe_name(cfg.name)}-s{n_slices:03d}"
            console.print(
                f"[bold]{cfg.name}[/]: soak {slice_id}, {length:,.0f} s from t={elapsed.get(cfg.name, 0.0):,.0f} s ({soak.load_kind()}"
                + (", one engine for the whole soak)" if not soak.slice_s else ", engine restarted per slice)")
            )
            state.set_config_status(cfg.name, status="soaking")
            session = ctx.session(cfg, "soak", ports[cfg.name])
            try:
                session.start()
                before = elapsed.get(cfg.name, 0.0)
                result = SoakSlice(
                    ctx,
                    cfg,
                    session,
                    slice_id,
                    length,
                    before,
                    history,
                    detectors[cfg.name],
                    speeds[cfg.name],
                    prefills[cfg.name],
                ).run()
                elapsed[cfg.name] = before + max(result.elapsed_s, 1.0)
                # a soak a verdict stopped will not use the rest of its time
                progress.soak_done_s += (
                    soak.duration_s - before if result.outcome.stop or result.gave_up else result.elapsed_s
                )
                if result.outcome.stop is not None:
                    stopped[cfg.name] = result.outcome.why or "a verdict"
                    if result.outcome.stop == "run":
                        stop_run = f"{cfg.name}: {result.outcome.why}"
                elif result.gave_up:
                    stopped[cfg.name] = "gave up restarting the engine"
                # the bracket after a soak that ran its course (a stopped configuration's engine is not measured again)
                done = soak.duration_s - elapsed.get(cfg.name, 0.0) <= 1.0
                if done and not soak.slice_s and session.alive() and cfg.name not in stopped and stop_run is None:
                    after_soak(cfg, session)
            except EngineError as exc:
                console.print(f"  [red]soak failed to start ({type(exc).__name__}): {exc}[/]")
                failures.write(
                    {
                        "config": cfg.name,
                        "stage": "soak",
                        "kind": type(exc).__name__,
                        "message": str(exc),
                        "unix_s": time.time(),
                    }
                )
                stopped[cfg.name] = f"the engine did not start: {exc}"
            finally:
                session.stop()
            state.set_config_status(cfg.name, status="done", soak_s=round(elapsed.get(cfg.name, 0.0), 1))
            console.print(progress.line(f"soak of {cfg.name}"), highlight=False)
            if stop_run is not None:
                break
    if soak.slice_s and stop_run is None:
        for cfg in cfgs:  # interleaved: the bracket after every configuration has finished its slices
            if cfg.name not in stopped and not any(
                r.get("config") == cfg.name for r in read_jsonl(run_dir / AFTER_SOAK)
            ):
                session = ctx.session(cfg, "after-soak")
                try:
                    session.start()
                    after_soak(cfg, session)
                except EngineError as exc:
                    console.print(f"  [red]after-soak measurement failed ({type(exc).__name__}): {exc}[/]")
                finally:
                    session.stop()
    # the verdicts decide: a configuration whose soak crashed, hung, collapsed, ran out of memory or was stopped failed
    verdicts = [v for v in read_jsonl(run_dir / VERDICTS_FILE) if v.get("config") in detectors]
    windows = list(read_jsonl(run_dir / WINDOWS))
    soak_failed = []
    for cfg in cfgs:
        bad = [v for v in verdicts if v["config"] == cfg.name and verdict_fails(v)]
        cov = coverage(w for w in windows if w.get("config") == cfg.name)
        summary: dict[str, Any] = {
            "status": "failed" if bad or cfg.name in stopped else "ok",
            "soak_s": round(elapsed.get(cfg.name, 0.0), 1),
            "stopped_by": stopped.get(cfg.name),
            # beside the verdict, how much of the soak was looked at (docs/soak.md#coverage)
            "windows": cov.windows,
            "judged_windows": cov.judged,
            "not_judged": cov.not_judged,
            # offered more than it served: a finding, not a failure (docs/soak.md#overload)
            "overloads": [overload_cell(v) for v in verdicts if v["config"] == cfg.name and v["kind"] == "overload"],
        }
        if cov.windows:
            console.print(f"  soak windows judged: {cov.sentence(cfg.name)}", highlight=False)
        if bad:
            first = bad[0]
            summary["first_failure"] = {
                k: first.get(k) for k in ("kind", "metric", "message", "t_unix", "engine_uptime_s", "action")
            }
        if summary["status"] == "failed":
            soak_failed.append(cfg.name)
        state.manifest.configurations[cfg.name].update(soak=summary)
    state.write()
    return soak_failed, stop_run
