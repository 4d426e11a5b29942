"""The SLO ramp: the most concurrent streams a configuration serves within the SLO, found by doubling then bisecting."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from harness.config.schema import Configuration, Slo
from harness.detect.servable import search_max_streams, slo_verdict
from harness.records.files import JsonlWriter
from harness.run.phases import PhaseExecutor, PhaseSpec
from harness.session.engine import EngineSession


def run_ramp(
    phases: PhaseExecutor, cfg: Configuration, session: EngineSession, slo: Slo, out: JsonlWriter, console: Console
) -> None:
    """Max streams under the SLO: double N from ``start`` while it holds, then bisect between the
    last N that held and the first that did not. One 'step' record per N, then the 'result'."""
    ramp = slo.ramp
    assert ramp is not None
    run_params = phases.ctx.params
    params = dataclasses.replace(run_params, max_tokens=ramp.max_tokens or run_params.max_tokens)
    tried: dict[int, bool] = {}

    def step(n: int) -> bool:
        done = phases.run(cfg, session, PhaseSpec("ramp", n, len(tried) + 1, ramp.requests_per_stream, 0, params), None)
        rec = done.record
        v = slo_verdict(
            ((r.status, r.decode_tps, r.ttft_s) for r in done.requests), slo.per_stream_tps_min, slo.ttft_p95_s_max
        )
        tried[n] = v.passed
        out.write(
            {
                "event": "step",
                "config": cfg.name,
                "streams": n,
                "attempt": rec.attempt,
                "passed": v.passed,
                "per_stream_tps": v.per_stream_tps,
                "ttft_p95_s": v.ttft_p95_s,
                "failed": v.failed,
                "why": v.why,
                "requests": rec.requests,
                "total_tps": rec.total_tps,
                "start_unix_s": rec.start_unix_s,
                "end_unix_s": rec.end_unix_s,
                "other_cores": rec.cpu["other_cores"],
                "contaminated": rec.contaminated,
            }
        )
        console.print(
            f"  ramp: {v.evidence(n)}"
            + (f" ({v.why})" if v.why else "")
            + (" [yellow](contaminated)[/]" if rec.contaminated else "")
        )
        return v.passed

    good, bad = search_max_streams(step, ramp.start, ramp.max_streams)
    out.write(
        {
            "event": "result",
            "config": cfg.name,
            "max_streams": good,
            "first_failing": bad,
            "lower_bound": bad is None,
            "steps": len(tried),
            "slots": session.capacity().slots,
        }
    )
    console.print(
        f"  ramp: max streams {'≥ ' if bad is None else ''}{good}"
        + (f" (N={bad} failed)" if bad is not None else f" (ramp's max_streams {ramp.max_streams})")
    )
