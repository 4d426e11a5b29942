"""Checks a scenario's fields alone cannot make: the prompt and trace files it names, whether they hold enough
distinct prompts, and what a soak's settings will not show as the user expects."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.common.errors import ScenarioError
from harness.config.estimate import describe_duration
from harness.config.schema import Scenario

Where = Callable[[tuple[Any, ...]], str]  # a field's location -> "FILE:LINE: field" for an error message


def check_files(scenario: Scenario, base: Path, at: Where) -> None:
    """The prompt and trace files a run would read (relative paths from ``base``, the scenario's folder): missing or
    broken is bad input, found before anything starts; ``at`` names the field in the error."""
    from harness.prompts import PromptError, load_prompts

    refs: list[tuple[tuple[Any, ...], str]] = [(("measurement", "prompts"), scenario.measurement.prompts)]
    if scenario.soak is not None and scenario.soak.prompts:
        refs.append((("soak", "prompts"), scenario.soak.prompts))
    sizes: dict[str, int] = {}
    for loc, ref in refs:
        try:
            sizes[loc[0]] = len(load_prompts(ref, base))
        except PromptError as exc:
            raise ScenarioError(f"{at(loc)}: {exc}") from None
    _check_reuse(scenario, at, sizes["measurement"])
    trace = scenario.soak.shape.trace if scenario.soak is not None else None
    if trace and not (Path(trace) if Path(trace).is_absolute() else base / trace).is_file():
        loc = ("soak", "shape", "trace")
        raise ScenarioError(f"{at(loc)}: no such trace file: {trace}")


def _check_reuse(scenario: Scenario, at: Where, set_size: int) -> None:
    """``measurement.prompt_reuse: forbid``: the prompts a configuration's measured phases send must all differ,
    so the set (or the built prompts) must hold as many as the phases send: said with both counts."""
    from harness.prompts.lengths import measurement_requests

    m = scenario.measurement
    if m.prompt_reuse != "forbid":
        return
    need = measurement_requests(m)
    built = m.lengths is not None and m.lengths.input is not None
    have = (m.lengths.prompts or need) if built and m.lengths is not None else set_size
    if need > have:
        loc = ("measurement", "lengths", "prompts") if built else ("measurement", "prompts")
        what = f"measurement.lengths.prompts is {have}" if built else f"{m.prompts} holds {have} prompts"
        raise ScenarioError(
            f"{at(loc)}: the measured phases send {need} requests per configuration and "
            f"measurement.prompt_reuse is 'forbid', but {what}: give at least {need} prompts"
            + ("" if built else " (or build them at drawn lengths: measurement.lengths.input)")
            + ", or set prompt_reuse: allow"
        )


def soak_warnings(sc: Scenario) -> list[str]:
    """What a soak scenario may not show as the user expects (``specsoak validate`` prints them)."""
    out: list[str] = []
    if sc.soak is None:
        return out
    if sc.soak.slice_s is not None and sc.soak.slice_s < sc.soak.duration_s:
        out.append(
            f"soak.slice_s ({describe_duration(sc.soak.slice_s)}) restarts each configuration's engine every slice: no engine lives "
            f"longer than that, so a collapse that needs more engine uptime cannot appear; remove slice_s to keep one engine "
            f"for the whole {describe_duration(sc.soak.duration_s)} soak"
        )
    wd = sc.soak.watchdog
    judged_after = (wd.warmup_windows + wd.reference_windows) * wd.window_s
    if judged_after >= sc.soak.duration_s:
        out.append(
            f"soak.watchdog: the change detector needs {describe_duration(judged_after)} of warm-up and reference windows, "
            f"longer than the soak ({describe_duration(sc.soak.duration_s)}): nothing will be judged"
        )
    if wd.memory_limit_mib is not None:
        from engines import ENGINES

        engine = ENGINES.get(sc.server.engine)
        for cfg in sc.runs():
            cap = engine.host_cache_cap_mib([*sc.server.extra_args, *cfg.engine_args]) if engine is not None else None
            if cap is not None and (cap < 0 or cap >= wd.memory_limit_mib):
                out.append(
                    f"configuration '{cfg.name}': the engine's prompt cache may grow to "
                    f"{'no limit' if cap < 0 else f'{cap:,.0f} MiB'}, more than soak.watchdog.memory_limit_mib "
                    f"({wd.memory_limit_mib:,.0f} MiB): with distinct prompts the soak will end in a 'memory' verdict"
                )
    if wd.stall_warn_s >= sc.soak.stall_s:
        out.append(
            f"soak.watchdog.stall_warn_s ({wd.stall_warn_s:g} s) is not below soak.stall_s ({sc.soak.stall_s:g} s): a pause "
            f"fails its requests before the watchdog can warn of it"
        )
    # the before/after comparison is Welch's interval, a spread on each side (scipy: imported only when validating)
    from harness.common.stats import UNPAIRED_MIN_PER_SIDE

    short = [
        f"{field} is {n}"
        for field, n in (
            ("measurement.repetitions", sc.measurement.repetitions),
            ("soak.after_repetitions", sc.soak.after_repetitions),
        )
        if n < UNPAIRED_MIN_PER_SIDE
    ]
    if short:
        out.append(
            f"{' and '.join(short)}: the after-soak comparison needs two repetitions on each side for an interval, so it "
            f"will say 'n/a' and never 'degraded'; set 3 (docs/soak.md#after-the-soak)"
        )
    canary = sc.soak.canary
    if (
        canary.enabled is not False
        and any(c.speculative for c in sc.soak_configurations())
        and canary.every_s >= sc.soak.duration_s
    ):
        out.append(
            f"soak.canary.every_s ({describe_duration(canary.every_s)}) is not shorter than the soak ({describe_duration(sc.soak.duration_s)}): "
            f"the canary answers once, before the traffic, so only a baseline's answers can be compared with"
        )
    return out
