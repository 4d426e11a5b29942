"""How long a run of a scenario should take, and what its measurement design costs in engine starts."""

from __future__ import annotations

from harness.config.schema import Scenario

ASSUMED_STREAM_TPS = (
    20.0  # decode t/s per stream the wall-clock estimate assumes (a small model on a CPU, a large one on a GPU)
)
ASSUMED_START_S = 10.0  # engine start to ready


def wall_clock_estimate(sc: Scenario) -> dict[str, float]:
    """Seconds a run of ``sc`` should take, by part: phases (and the ramp, fill check, after-soak bracket) at an
    assumed ASSUMED_STREAM_TPS per stream, plus the soak, which is exact: its duration times its configurations."""
    m = sc.measurement
    n_cfg = len(sc.runs())
    request_s = m.max_tokens / ASSUMED_STREAM_TPS + 0.5
    warmup_s = m.warmup_requests * request_s
    if m.arrival is not None:  # open loop: each phase lasts its schedule, and the last answer after it
        phases_s = warmup_s + sum(
            m.repetitions * (m.arrival.expected_span_s(key) + request_s)
            for key in m.arrival.keys()  # noqa: SIM118  Arrival.keys() is the model's method (its phase keys), not a dict's
        )
    else:
        phases_s = warmup_s + sum(m.repetitions * m.requests_per_stream * request_s for _ in m.streams)
    # interleaved: a fresh engine (and its warm-up) per configuration and block
    starts = m.repetitions if m.design == "interleaved" else 1
    start_s = typical_start_s(sc.server.engine) or ASSUMED_START_S
    measure_s = n_cfg * (starts * (start_s + warmup_s) + phases_s - warmup_s)
    ramp_s = 0.0
    if sc.slo and sc.slo.ramp:
        r = sc.slo.ramp
        steps = max(1, (r.max_streams // max(1, r.start)).bit_length() + 2)
        ramp_s = n_cfg * steps * r.requests_per_stream * ((r.max_tokens or m.max_tokens) / ASSUMED_STREAM_TPS + 0.5)
    fill_s = n_cfg * (ASSUMED_START_S + 30.0) if sc.report.fill_check else 0.0
    soak_s = after_s = 0.0
    if sc.soak is not None:
        n_soak = len(sc.soak_configurations())
        soak_s = n_soak * sc.soak.duration_s
        # the phases again on the soaked engine, soak.after_repetitions times over, without a warm-up
        after_s = n_soak * (ASSUMED_START_S + (phases_s - warmup_s) * sc.soak.after_repetitions / m.repetitions)
    total = measure_s + ramp_s + fill_s + soak_s + after_s
    return {
        "total_s": total,
        "measurement_s": measure_s,
        "ramp_s": ramp_s,
        "fill_check_s": fill_s,
        "soak_s": soak_s,
        "after_soak_s": after_s,
    }


def describe_duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def typical_start_s(engine: str) -> float | None:
    """Seconds a slow-starting engine takes to become ready, roughly (its adapter's typical_start_s); None: a few."""
    from engines import ENGINES

    cls = ENGINES.get(engine)
    return cls.typical_start_s if cls is not None else None


def design_warnings(sc: Scenario) -> list[str]:
    """What the measurement design costs on this engine (``specsoak validate`` prints it)."""
    m = sc.measurement
    start_s = typical_start_s(sc.server.engine)
    if m.design != "interleaved" or start_s is None or m.repetitions < 2 or sc.server.url is not None:
        return []
    starts = m.repetitions * len(sc.runs())
    return [
        f"measurement.design interleaved starts every configuration's engine once per block: {starts} starts of "
        f"{sc.server.engine} (about {describe_duration(starts * start_s)} of start-up); 'design: sequential' starts each once, "
        f"but then a machine that drifts over minutes lands on whichever configuration is running (docs/reports.md#design)"
    ]
