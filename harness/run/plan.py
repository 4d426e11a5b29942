"""``specsoak plan``: what a run of a scenario would do, in order, without starting anything.

For each configuration the engine's command line (secrets masked, a placeholder port), then the phases in the
runner's order (harness/run/runner.py), then the wall-clock estimate. Model files that are not here are reported,
not fatal: a GPU scenario can be planned on a laptop.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from engines.base import Engine
from harness.common.errors import EngineError
from harness.config.estimate import ASSUMED_STREAM_TPS, describe_duration, wall_clock_estimate
from harness.config.loader import LoadedScenario
from harness.config.reference import ignored_fields
from harness.config.schema import Scenario, Shape, SoakArrival, load_label, safe_name
from harness.models.ref import PACKAGE_PREFIX, WORKSHOP_PREFIX, ModelNotFound, resolve_model
from harness.run.order import block_order
from harness.soak.disk import describe_estimate, disk_warnings

PORT = 0  # the placeholder port the command line is built with; shown as <port>
RUN_DIR = Path("results/<run>")


def missing_models(loaded: LoadedScenario, model_folders: bool) -> dict[str, str]:
    """Model references that name nothing on this machine: reference -> why. Resolves ``package:`` references in
    ``loaded.models`` to their files; never builds a workshop model."""
    missing: dict[str, str] = {}
    for ref, path in list(loaded.models.items()):
        if ref.startswith(PACKAGE_PREFIX):
            try:
                loaded.models[ref] = resolve_model(ref, loaded.path.parent)
            except ModelNotFound as exc:
                loaded.models[ref] = Path(ref)
                missing[ref] = str(exc)
        elif ref.startswith(WORKSHOP_PREFIX):
            if not path.exists():
                missing[ref] = f"not built yet: the run builds it into {path}"
        elif not (path.is_file() or (model_folders and path.is_dir())):
            missing[ref] = f"no such model {'file or folder' if model_folders else 'file'}: {path}"
    return missing


def command_line(engine: Engine) -> str:
    """The engine's command as it would be logged (secrets masked), with <port> for the port chosen at start."""
    cmd = engine.display_command()
    out = [
        "<port>" if a == str(PORT) and i > 0 and "port" in cmd[i - 1].lower() and engine.spec.port == PORT else a
        for i, a in enumerate(cmd)
    ]
    return shlex.join(out).replace("'<port>'", "<port>")


def describe_shape(shape: Shape, duration_s: float) -> str:
    k = shape.kind
    if k == "steady":
        return f"steady, {shape.users} stream{'s' if shape.users > 1 else ''}"
    if k == "ramp":
        return f"ramp from {shape.start_users} to {shape.users} streams"
    if k == "diurnal":
        return (
            f"diurnal, trough {shape.start_users} and peak {shape.users} streams, "
            f"one day every {describe_duration(shape.period_s or duration_s)}"
        )
    if k == "bursts":
        return (
            f"bursts, {shape.users} streams and {shape.peak_users} for the last {describe_duration(shape.burst_s)} "
            f"of every {describe_duration(shape.period_s or 60.0)}"
        )
    return f"replay of {shape.trace}, at most {shape.users} in flight"


def describe_soak_arrival(a: SoakArrival, duration_s: float) -> str:
    kind = f"gamma (cv {a.cv:g})" if a.kind == "gamma" else a.kind
    if a.stages is not None:
        cycle = sum(s.duration_s for s in a.stages)
        rates = ", ".join(f"{s.rate_rps:g} rps x {describe_duration(s.duration_s)}" for s in a.stages[:4]) + (
            ", ..." if len(a.stages) > 4 else ""
        )
        rate = f"stages {rates}" + (f", cycled every {describe_duration(cycle)}" if cycle < duration_s else "")
    elif a.curve == "diurnal":
        rate = f"diurnal, trough {a.trough_rps:g} and peak {a.rate_rps:g} rps, one day every {describe_duration(a.period_s or duration_s)}"
    else:
        rate = f"{a.rate_rps:g} rps"
    return f"open-loop {kind} arrivals, {rate}, at most {a.max_in_flight} in flight"


def _phases(sc: Scenario, reps: str) -> list[str]:
    """The warm-up and one line per stream count (``reps``: how many repetitions, or which one)."""
    m = sc.measurement
    out = []
    if m.warmup_requests:
        out.append(
            f"warm-up: {m.warmup_requests} request{'s' if m.warmup_requests > 1 else ''} on 1 stream, not measured"
        )
    if m.arrival is not None:
        a = m.arrival
        gaps = a.kind + (f" (cv {a.cv:g})" if a.cv is not None else "")
        for key in a.keys():  # noqa: SIM118  Arrival.keys() is the model's method (its phase keys), not a dict's
            rate = a.rate_of(key)
            what = (
                f"{a.requests} requests at {rate:g} rps"
                if rate is not None
                else f"{len(a.stages or [])} stages over {describe_duration(a.expected_span_s(key))}"
            )
            out.append(
                f"open loop {load_label(key)}{reps}: {what}, {gaps} gaps, at most {a.max_in_flight} in flight, "
                f"{m.max_tokens} tokens each"
            )
        if a.saturation.stop_after is not None:
            out.append(
                f"adaptive sweep: in each repetition, a configuration skips the higher rates once {a.saturation.stop_after} "
                f"rate{'s' if a.saturation.stop_after > 1 else ''} in a row saturated (the estimate counts every rate)"
            )
        return out
    out.extend(
        f"{n} stream{'s' if n > 1 else ''}{reps}: {n * m.requests_per_stream} requests of {m.max_tokens} tokens"
        for n in m.streams
    )
    return out


def plan_lines(loaded: LoadedScenario, engine_cls: type[Engine]) -> list[str]:
    """The plan as text lines (``specsoak plan`` prints them)."""
    from harness.session.engine import launch_spec

    sc = loaded.scenario
    srv = sc.server
    m = sc.measurement
    runs = sc.runs()
    attached = getattr(srv, "url", None)  # attach mode: an engine the harness does not start
    missing = {} if attached else missing_models(loaded, engine_cls.model_folders)
    design = getattr(m, "design", "sequential")
    lines = [
        f"{loaded.path}: {sc.name}: {len(runs)} configuration{'s' if len(runs) > 1 else ''} on {srv.engine}"
        + (f", attached to {attached}" if attached else "")
        + f"; measurement design: {design}"
    ]

    lines.append("")
    lines.append("configurations:")
    for cfg in runs:
        base = sc.baseline_of(cfg)
        what = (
            [cfg.algorithm]
            + ([f"k={cfg.k}"] if cfg.k is not None else [])
            + (["synthetic"] if cfg.is_synthetic else [])
        )
        lines.append(
            f"  {cfg.name} ({', '.join(what)})"
            + (f", against {base.name}" if base is not None and base is not cfg else "")
        )
        if attached:
            lines.append(
                f"    attached to {attached}: nothing is started or stopped"
                + "".join(f"; {k} {getattr(srv, k)}" for k in ("metrics_url", "log_file") if getattr(srv, k, None))
            )
        else:
            engine = engine_cls(launch_spec(loaded, cfg, PORT), RUN_DIR / "logs" / f"{safe_name(cfg.name)}.server.log")
            try:
                lines.append(f"    $ {command_line(engine)}")
            except EngineError as exc:  # the engine is not installed here: say so, plan the rest
                lines.append(f"    no command line on this machine: {exc}")
            env = dict(engine.spec.env) | dict.fromkeys(engine.engine_env(), "***")
            if env:
                lines.append("    environment: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
            options = getattr(engine, "options", None)
            if callable(options):
                lines.append(f"    {getattr(engine, 'config_path', '--config')}: {json.dumps(options())}")
    lines.append("models:" + (" served by the attached server, not looked for here" if attached else ""))
    for ref, path in ({} if attached else loaded.models).items():
        lines.append(
            f"  {ref}"
            + (f": MISSING: {missing[ref]}" if ref in missing else (f" = {path}" if str(path) != ref else ": found"))
        )
    notes = ignored_fields(sc)
    if notes:
        lines.append("not honoured:")
        lines += [f"  {note}" for note in notes]

    lines.append("")
    lines.append("phases, in order:")
    ramp = sc.slo.ramp if sc.slo else None
    ramp_line = (
        (
            f"ramp: max streams under the SLO, from {ramp.start} doubling up to {ramp.max_streams}, then bisecting; "
            f"{ramp.requests_per_stream} requests per stream per step"
        )
        if ramp
        else None
    )
    fill_line = (
        (
            f"fill check: restart at the servable context under {sc.report.memory_budget_mib:g} MiB, fill every slot"
            + ("" if engine_cls.ctx_sizes_kv else f" ({srv.engine}: recorded as unsupported, not restarted)")
        )
        if sc.report.fill_check
        else None
    )
    start = "connect" if attached else f"start {srv.engine} (ready within {describe_duration(srv.start_timeout_s)})"
    stop = "disconnect" if attached else "stop"
    reps = f"{m.repetitions} repetition{'s' if m.repetitions > 1 else ''}"
    if design == "interleaved":
        order_seed = getattr(m, "order_seed", None)
        for rep in range(1, m.repetitions + 1):
            order = _block_order([c.name for c in runs], order_seed, rep)
            lines.append(
                f"  block {rep}/{m.repetitions}: every configuration once, "
                + ("on the attached server" if attached else "each on a fresh engine")
                + ", in "
                + (f"this order: {', '.join(order)}" if order else "an order shuffled from a seed drawn at the start")
            )
            lines += [f"    {x}" for x in (start, *_phases(sc, f", repetition {rep}"), stop)]
        for cfg in runs:
            extra = [x for x in (f"{start}; {ramp_line}; {stop}" if ramp_line else None, fill_line) if x]
            if extra:
                lines.append(f"  {cfg.name}: " + "; ".join(extra))
    else:
        for cfg in runs:
            lines.append(f"  {cfg.name}: {start}")
            lines += [f"    {p}" for p in _phases(sc, f" x {reps}")]
            if ramp_line:
                lines.append(f"    {ramp_line}")
            lines.append(f"    {stop}")
            if fill_line:
                lines.append(f"    {fill_line}")
    if sc.soak is not None:
        soak = sc.soak
        shape = (
            describe_shape(soak.shape, soak.duration_s)
            if soak.arrival is None
            else describe_soak_arrival(soak.arrival, soak.duration_s)
        )
        prompts = soak.prompts or "builtin:soak"
        again = (
            f"the measurement phases again ({len(m.streams)} stream counts x {reps})"
            if m.arrival is None
            else f"the open-loop phases again, same schedules ({len(m.arrival.keys())} x {reps})"
        )
        for cfg in sc.soak_configurations():
            if soak.slice_s:
                n = -(-soak.duration_s // soak.slice_s)
                lines.append(
                    f"  soak {cfg.name}: {describe_duration(soak.duration_s)} in {n:.0f} slices of {describe_duration(soak.slice_s)}, "
                    f"alternating with the other configurations, a fresh engine per slice; {shape}; {prompts}"
                )
            else:
                lines.append(
                    f"  soak {cfg.name}: {start}; {describe_duration(soak.duration_s)} "
                    f"on {'the attached server' if attached else 'that one engine'}; {shape}; {prompts}; "
                    f"watchdog windows of {describe_duration(soak.watchdog.window_s)}"
                )
                lines.append(f"    after the soak, on the same engine: {again}; {stop}")
            lines.append(f"    work: {soak_work(sc)}")
        if soak.slice_s:
            lines.append(f"  after all slices, per configuration: {start}; {again}; {stop}")

    est = wall_clock_estimate(sc)
    parts = [
        f"{k.removesuffix('_s').replace('_', ' ')} {describe_duration(v)}"
        for k, v in est.items()
        if k != "total_s" and v > 0
    ]
    lines.append("")
    lines.append(
        f"estimated wall clock: {describe_duration(est['total_s'])} ({', '.join(parts)}; phases at an assumed "
        f"{ASSUMED_STREAM_TPS:g} t/s per stream, the soak exactly)"
    )
    lines.append(f"estimated disk: {describe_estimate(sc)}")
    lines += [f"warning: {w}" for w in disk_warnings(sc, Path("results"))]
    return lines


def soak_work(sc: Scenario) -> str:
    """How many requests and output tokens one configuration's soak pushes through: exact in the open loop's mean rate,
    an estimate at ASSUMED_STREAM_TPS per closed-loop user (some failures come after a count, not a time)."""
    from harness.load.shapes import users_at

    soak = sc.soak
    if soak is None:
        return ""
    tokens = soak.max_tokens or sc.measurement.max_tokens
    if soak.arrival is not None:
        n = soak.arrival.mean_rps(soak.duration_s) * soak.duration_s
        return f"about {n:,.0f} requests and {n * tokens:,.0f} output tokens (the arrival curve's mean rate)"
    steps = 200
    shape = soak.shape.model_dump()
    users = sum(users_at(shape, soak.duration_s * (i + 0.5) / steps, soak.duration_s) for i in range(steps)) / steps
    n = users * soak.duration_s * ASSUMED_STREAM_TPS / tokens
    return (
        f"about {n:,.0f} requests and {n * tokens:,.0f} output tokens at an assumed {ASSUMED_STREAM_TPS:g} t/s per user "
        f"({users:.3g} users on average); the soak table counts what was served"
    )


def _block_order(names: list[str], seed: int | None, block: int) -> list[str] | None:
    """Block ``block``'s order when the scenario fixes the seed (else it is drawn when the run starts)."""
    return None if seed is None else block_order(names, seed, block)
