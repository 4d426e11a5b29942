"""Progress with an estimate (harness/run/progress.py): the plan's model, corrected by the pace of finished phases."""

from __future__ import annotations

from harness.run.progress import Progress

PLAN = {
    "total_s": 1000.0,
    "measurement_s": 400.0,
    "ramp_s": 0.0,
    "fill_check_s": 0.0,
    "soak_s": 600.0,
    "after_soak_s": 0.0,
}


def test_the_estimate_starts_from_the_plan_and_follows_the_pace() -> None:
    p = Progress(dict(PLAN), phases_total=4, started=0.0)
    p.elapsed_s = lambda: 0.0  # type: ignore[method-assign]  # a fixed clock
    assert p.left_s() == 1000.0
    # two phases done in 400 s, twice the plan's 100 s each: the two left will take 400 s too
    p.phase_done()
    p.phase_done()
    p.elapsed_s = lambda: 400.0  # type: ignore[method-assign]  # a fixed clock
    assert p.left_s() == 400.0 + 600.0
    # the soak is exact: 200 of its 600 s done
    p.soak_done_s = 200.0
    p.elapsed_s = lambda: 600.0  # type: ignore[method-assign]  # a fixed clock
    assert p.left_s() == 400.0 + 400.0
    assert "2/4 phases" in p.line("x") and "about 13 min left" in p.line("x")
    rec = p.record()
    assert rec["planned_s"] == 1000.0 and rec["actual_s"] == 600.0 and rec["error"] == -0.4
    assert not p.resumed


def test_a_resumed_run_says_so() -> None:
    p = Progress(dict(PLAN), phases_total=4, phases_done=2, started=0.0)
    assert p.resumed
    p.phase_done()
    assert p.phases_done == 3 and p.resumed
