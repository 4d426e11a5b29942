"""The request-rate sweep: saturation judged on synthetic open-loop phase records, the saturation point, where
speculation stops paying in requests per second, the adaptive sweep's stop, and the report's table, CSV and plot
(harness/detect/saturation.py, harness/report/sweep.py; docs/metrics.md#rate-sweep)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from harness.common.errors import ScenarioError
from harness.config.schema import Scenario
from harness.detect.saturation import (
    Judgement,
    PaysAt,
    Rule,
    judge,
    judge_rate,
    pays_at,
    saturation_point,
    stop_sweep,
    stops_paying,
)
from harness.load.arrivals import arrival_figures
from harness.load.schedule import Schedule
from harness.records.files import RequestRecord
from harness.records.types import Manifest, Phase

ROOT = Path(__file__).resolve().parents[2]
RULE = Rule()  # 0.9 completions, 10% late, 90% meeting the SLO


def _phase(
    rate: float, completion: float = 1.0, late: int = 0, met: int | None = None, n: int = 20, **more: Any
) -> dict[str, Any]:
    """An open-loop phase record at ``rate`` whose responses complete at ``completion`` times the scheduled rate."""
    return {
        "scheduled": n,
        "requests": n,
        "ok": n,
        "offered_rps": rate,
        "achieved_rps": rate * 0.8,
        "schedule_rps": rate,
        "completion_rps": rate * completion,
        "late": late,
        "slo_met": met,
        **more,
    }


def test_a_phase_that_keeps_up_is_not_saturated() -> None:
    # achieved 0.8× offered (the tail of the last answers in a short phase) is not saturation: completions follow the schedule
    j = judge(_phase(2.0, completion=0.95, late=2, met=18), RULE)
    assert (
        not j.saturated
        and j.why == ""
        and j.completion_ratio == pytest.approx(0.95)
        and j.late_share == pytest.approx(0.1)
    )
    assert j.goodput_ratio == pytest.approx(0.9)  # exactly at each bound: still keeping up


def test_only_sends_that_waited_for_a_slot_count_as_the_engine_falling_behind() -> None:
    # the CI flake of 2026-12-07: at 0.5 rps one send of 8 went out >10 ms late with both slots free (a busy
    # client, not a full engine), and 1/8 late saturated the lowest rate
    slip = judge(_phase(0.5, n=8, late=1, queued=0), RULE)
    assert not slip.saturated and slip.late_share == 0.0
    full = judge(_phase(6.0, n=8, late=6, queued=5), RULE)
    assert full.saturated and full.late_share == pytest.approx(5 / 8) and "waiting for a slot" in full.why
    assert judge(_phase(0.5, n=8, late=1), RULE).saturated  # records from before `queued`: every late send counts


@pytest.mark.parametrize(
    ("phase", "words"),
    [
        (_phase(4.0, completion=0.6), "completions 0.60× the scheduled rate"),
        (_phase(4.0, late=3), "15% sent late"),
        (_phase(4.0, met=17), "85% met the SLO"),
    ],
)
def test_each_bound_alone_saturates_and_says_why(phase: dict[str, Any], words: str) -> None:
    j = judge(phase, RULE)
    assert j.saturated and words in j.why and ";" not in j.why


def test_every_bound_crossed_is_named_and_the_bounds_come_from_the_scenario() -> None:
    j = judge(_phase(8.0, completion=0.3, late=10, met=2), RULE)
    assert j.saturated and j.why.count(";") == 2
    lax = Rule.of({"completion_ratio_min": 0.2, "late_share_max": 0.6, "goodput_ratio_min": 0.05})
    assert not judge(_phase(8.0, completion=0.3, late=10, met=2), lax).saturated
    sc = Scenario.model_validate(
        {
            "name": "s",
            "server": {"model": "m.gguf"},
            "configurations": [{"name": "b"}],
            "measurement": {"arrival": {"rate_rps": [1, 2], "saturation": {"late_share_max": 0.5, "stop_after": 2}}},
        }
    )
    assert sc.measurement.arrival is not None
    assert Rule.of(sc.measurement.arrival.saturation) == Rule(0.9, 0.5, 0.9)
    assert Rule.of(sc.measurement.arrival.saturation.model_dump()) == Rule(0.9, 0.5, 0.9)  # as a manifest holds it


def test_no_slo_means_no_goodput_bound_and_old_records_fall_back_to_achieved_over_offered() -> None:
    assert judge(_phase(4.0), RULE).goodput_ratio is None
    old = {
        "scheduled": 10,
        "offered_rps": 4.0,
        "achieved_rps": 2.0,
        "late": 0,
        "ok": 10,
    }  # recorded before completion_rps
    j = judge(old, RULE)
    assert j.saturated and j.completion_ratio == pytest.approx(0.5)


def test_a_rate_over_repetitions_is_judged_on_the_medians() -> None:
    reps = [_phase(4.0, completion=0.5), _phase(4.0, completion=0.95), _phase(4.0, completion=0.97)]
    assert not judge_rate(reps, RULE).saturated  # one slow repetition of three
    assert judge_rate([*reps[:1], _phase(4.0, completion=0.7), *reps[2:]], RULE).saturated


def _j(saturated: bool, why: str = "x") -> Judgement:
    return Judgement(saturated, why if saturated else "", None, None, None)


def test_saturation_point_is_the_first_saturated_rate_ascending() -> None:
    sp = saturation_point([(4.0, _j(True, "late")), (0.5, _j(False)), (1.0, _j(False)), (8.0, _j(True))])
    assert (sp.kind, sp.sustained_rps, sp.saturation_rps, sp.why) == ("saturated", 1.0, 4.0, "late")
    # a noisy higher rate that kept up does not move the point: the first failure decides
    assert saturation_point([(1.0, _j(False)), (2.0, _j(True)), (3.0, _j(False))]).saturation_rps == 2.0
    low = saturation_point([(1.0, _j(True)), (2.0, _j(True))])
    assert (low.kind, low.sustained_rps, low.saturation_rps) == ("saturated", None, 1.0)
    none = saturation_point([(1.0, _j(False)), (2.0, _j(False))])
    assert (none.kind, none.sustained_rps, none.saturation_rps) == ("not reached", 2.0, None)
    assert saturation_point([]).kind == "no rates"


def test_the_adaptive_sweep_stops_after_stop_after_saturated_rates_in_a_row() -> None:
    assert not stop_sweep([_j(False), _j(True)], None)  # no stop_after: every rate is measured
    assert stop_sweep([_j(False), _j(True)], 1)
    assert not stop_sweep([_j(True), _j(False)], 1)  # the last rate kept up
    assert not stop_sweep([_j(False), _j(True)], 2) and stop_sweep([_j(False), _j(True), _j(True)], 2)
    assert not stop_sweep([_j(True), _j(False), _j(True)], 2)  # in a row


def test_stop_after_is_refused_for_a_stage_list() -> None:
    with pytest.raises(ValueError, match="stop_after"):
        Scenario.model_validate(
            {
                "name": "s",
                "server": {"model": "m.gguf"},
                "configurations": [{"name": "b"}],
                "measurement": {
                    "arrival": {"stages": [{"rate_rps": 1, "duration_s": 5}], "saturation": {"stop_after": 1}}
                },
            }
        )
    assert ScenarioError  # the CLI path turns it into a ScenarioError naming the field (tests/unit/test_arrivals.py)


def test_pays_when_latency_is_lower_and_goodput_no_less() -> None:
    assert pays_at(1.0, 0.8, 1.0, 1.0).pays
    assert not pays_at(1.0, 1.05, 1.0, 1.0).pays  # slower
    assert not pays_at(1.0, 0.8, 0.5, 1.0).pays  # faster median but half the goodput
    assert pays_at(1.0, 0.8, 0.99, 1.0).pays  # within the 2% tolerance
    assert pays_at(1.0, 0.8, None, None).pays  # no SLO: latency alone
    assert not pays_at(1.0, None, 1.0, 1.0).pays
    assert pays_at(1.0, 0.9, 0.3, 0.0).goodput_ratio == float("inf")


def _pays(*flags: bool) -> list[PaysAt]:
    return [PaysAt(float(i + 1), f, None, None) for i, f in enumerate(flags)]


def test_where_speculation_stops_paying() -> None:
    assert stops_paying(_pays(True, True, False, False)) == ("crosses", 2.0, 3.0)
    assert stops_paying(_pays(True, True)) == ("always", 2.0, None)
    assert stops_paying(_pays(False, False)) == ("never", None, 1.0)
    assert stops_paying(_pays(False, True, False)) == ("mixed", 2.0, 3.0)
    assert stops_paying([]) == ("no rates", None, None)


def test_arrival_figures_count_completions_first_to_last_against_the_schedule() -> None:
    # four requests scheduled 1 s apart (1 rps), each answered in 3 s once sent; the last two sent 1 s late
    starts, e2e = [0.0, 1.0, 3.0, 4.0], 3.0
    recs = [
        RequestRecord(
            "c",
            "arrivals",
            4,
            1,
            0,
            i,
            "p",
            "ok",
            100.0 + s,
            e2e_s=e2e,
            send_delay_s=max(0.0, s - i),
            late=s - i > 0.01,
        )
        for i, s in enumerate(starts)
    ]
    fig = arrival_figures(recs, Schedule(np.array([0.0, 1.0, 2.0, 3.0]), 4.0), wall_s=7.0)
    assert fig["schedule_rps"] == pytest.approx(1.0)  # 3 gaps over 3 s
    assert fig["completion_rps"] == pytest.approx(3 / 4.0)  # completions at 103, 104, 106, 107
    assert fig["e2e_from_schedule_p50_s"] == pytest.approx(3.5)  # 3, 3, 4, 4: latency counted from the scheduled time
    assert fig["achieved_rps"] == pytest.approx(4 / 7.0) and fig["late"] == 2


# ---- the report: table, CSV and plot from a results folder --------------------------------------------
FIXTURE = ROOT / "tests" / "fixtures" / "run_quick"

# (config, rate) -> (completion ratio, late, slo_met of 20, latency p50 s), both repetitions alike
SWEEP = {
    ("baseline", 0.5): (1.0, 0, 20, 1.0),
    ("baseline", 1.0): (0.98, 0, 20, 1.2),
    ("baseline", 2.0): (0.7, 8, 9, 4.0),
    ("ngram-map-k", 0.5): (1.0, 0, 20, 0.8),
    ("ngram-map-k", 1.0): (0.97, 1, 19, 1.3),
    ("ngram-map-k", 2.0): (0.6, 10, 5, 5.0),
}


def _sweep_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    phases = [json.loads(x) for x in (run / "phases.jsonl").read_text().splitlines() if x.strip()]
    template = {cfg: next(p for p in phases if p["config"] == cfg) for cfg in ("baseline", "ngram-map-k")}
    for (cfg, rate), (comp, late, met, lat) in SWEEP.items():
        for rep in (1, 2):
            key = f"{rate:g}rps"
            phases.append(
                {
                    **template[cfg],
                    "phase": "arrivals",
                    "streams": 4,
                    "repetition": rep,
                    "attempt": f"{cfg}/arrivals/{key}/{rep}/a",
                    "load": key,
                    "ok": 20,
                    "errors": 0,
                    "output_tokens": 0,
                    "counters": {
                        **template[cfg]["counters"],
                        "output_tokens": 0,
                        "draft_tokens": 0,
                        "accepted_tokens": 0,
                        "verify_steps": 0,
                    },
                    "client_draft_tokens": None,
                    "client_accepted_tokens": None,
                    "contaminated": False,
                    "arrival": {
                        "kind": "poisson",
                        "rate_rps": rate,
                        "cv": None,
                        "max_in_flight": 4,
                        "seed": 0,
                        "stages": None,
                    },
                    **_phase(rate, comp, late, met),
                    "requests": 0,
                    "goodput_rps": rate * met / 20 * 0.9,
                    "e2e_from_schedule_p50_s": lat * (1 + 0.01 * rep),
                    "max_send_delay_s": 1.0 if late else 0.0,
                }
            )
    (run / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in phases))
    return run


def test_report_has_the_saturation_table_csv_and_plot_from_the_results_folder(tmp_path: Path) -> None:
    from harness.report.build import build_report

    run = _sweep_run(tmp_path)
    rep = build_report([run])
    sat = pd.read_csv(run / "saturation.csv").set_index("config")
    assert sat.loc["baseline", "saturation_rps"] == 2.0 and sat.loc["baseline", "sustained_rps"] == 1.0
    assert (
        "40% sent late" in sat.loc["baseline", "decided_by"]
        and "completions 0.70×" in sat.loc["baseline", "decided_by"]
    )
    # n-gram: latency 0.8× at 0.5 rps (pays), 1.3/1.2 at 1 rps (does not): stops paying between them
    assert sat.loc["ngram-map-k", "pays_kind"] == "crosses" and sat.loc["ngram-map-k", "pays_up_to_rps"] == 0.5
    assert sat.loc["ngram-map-k", "first_not_paying_rps"] == 1.0
    assert isinstance(sat.loc["ngram-map-k", "break_even_streams"], str)  # the closed-loop break-even beside it
    points = pd.read_csv(run / "rate_sweep.csv")
    assert len(points) == 6 and set(points["rate_rps"]) == {0.5, 1.0, 2.0}
    row = points[(points["config"] == "ngram-map-k") & (points["rate_rps"] == 0.5)].iloc[0]
    assert row["latency_vs_baseline"] == pytest.approx(0.8) and bool(row["pays"])
    assert (run / "rate_sweep.png").stat().st_size > 10_000 and run / "rate_sweep.png" in rep.images
    md = rep.markdown.read_text()
    assert (
        "## Request-rate sweep: saturation" in md
        and "2 rps (completions 0.70×" in md
        and "pays up to 0.5 rps, not at 1" in md
    )
    # rebuilt from the folder alone: the same tables again
    again = build_report([run])
    assert again.tables["saturation"].equals(rep.tables["saturation"])


def test_a_run_without_open_loop_rates_has_no_sweep_section(tmp_path: Path) -> None:
    from harness.report.build import build_report

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    rep = build_report([run])
    assert (
        rep.tables["saturation"].empty
        and not (run / "saturation.csv").exists()
        and not (run / "rate_sweep.png").exists()
    )
    assert "Request-rate sweep" not in rep.markdown.read_text()


def test_the_runner_skips_rates_past_saturation_and_counts_them_done() -> None:
    """Runner._measure with the phase stubbed: after the first saturated rate (stop_after 1) the higher rates of the
    repetition are not measured, and count as done (else the catch-up after the blocks would measure them), in the
    manifest too (a resume reads them back)."""
    from types import SimpleNamespace

    from harness.run.manifest import RunState
    from harness.run.progress import Progress
    from harness.run.runner import Runner

    sc = Scenario.model_validate(
        {
            "name": "s",
            "server": {"model": "m.gguf"},
            "configurations": [{"name": "b"}],
            "measurement": {
                "warmup_requests": 0,
                "repetitions": 2,
                "arrival": {
                    "kind": "constant",
                    "rate_rps": [0.5, 6, 12],
                    "requests": 8,
                    "saturation": {"stop_after": 1},
                },
            },
        }
    )
    measured: list[tuple[str, int]] = []

    def phase(
        cfg: Any, session: Any, out: Any, load: str, rep: int, phase: str = "measure", like: int | None = None
    ) -> Phase:
        measured.append((load, rep))
        completion = 1.0 if load == "0.5rps" or rep == 2 else 0.3  # rep 2 keeps up at every rate
        return Phase.from_dict(
            {
                "config": "b",
                "phase": phase,
                "streams": 4,
                "repetition": rep,
                **_phase(float(load[:-3]), completion=completion),
            }
        )

    state = RunState(sc, None, None)  # type: ignore[arg-type]  # the parts this test does not reach
    state.manifest = Manifest.from_dict({"configurations": {"b": {}}})
    state.write = lambda: None  # type: ignore[method-assign]  # no run folder
    fake = SimpleNamespace(
        sc=sc,
        console=SimpleNamespace(print=lambda *a: None),
        state=state,
        _arrival_phase=phase,
        progress=Progress.of(sc),
        _say_progress=lambda *a: None,
    )
    cfg = SimpleNamespace(name="b")
    for rep in (1, 2):
        Runner._measure(fake, cfg, None, None, reps=[rep])  # type: ignore[arg-type]  # a stand-in runner, no engine
    assert measured == [("0.5rps", 1), ("6rps", 1), ("0.5rps", 2), ("6rps", 2), ("12rps", 2)]
    assert state.phases_done(cfg)  # type: ignore[arg-type]  # a stand-in configuration
    assert state.manifest.to_dict()["configurations"]["b"]["sweep_skipped"] == [["12rps", 1]]
    state.done_phases, measured[:] = set(), []
    sc2 = sc.model_copy(
        update={
            "measurement": sc.measurement.model_copy(
                update={
                    "arrival": sc.measurement.arrival.model_copy(  # type: ignore[union-attr]  # this scenario has an arrival
                        update={"saturation": sc.measurement.arrival.saturation.model_copy(update={"stop_after": None})}
                    )
                }
            )
        }
    )  # type: ignore[union-attr]  # this scenario has an arrival
    fake.sc = state.sc = sc2
    Runner._measure(fake, cfg, None, None, reps=[1])  # type: ignore[arg-type]  # a stand-in runner, no engine
    assert measured == [("0.5rps", 1), ("6rps", 1), ("12rps", 1)]  # no stop_after: every rate


def test_the_rate_sweep_scenario_validates_and_its_plan_says_it_is_adaptive() -> None:
    from engines import engine_class
    from harness.config.loader import load_scenario
    from harness.run.plan import plan_lines

    loaded = load_scenario(ROOT / "scenarios" / "rate-sweep-cpu.yaml", check_model_files=False)
    a = loaded.scenario.measurement.arrival
    assert a is not None and a.saturation.stop_after == 2 and len(a.keys()) == 6
    text = "\n".join(plan_lines(loaded, engine_class("llamacpp")))
    assert "skips the higher rates once 2 rates in a row saturated" in text


def test_a_contaminated_repetition_is_left_out_where_a_clean_one_exists(tmp_path: Path) -> None:
    from harness.report.build import build_report

    run = _sweep_run(tmp_path)
    phases = [json.loads(x) for x in (run / "phases.jsonl").read_text().splitlines() if x.strip()]
    for p in phases:  # baseline at 0.5 rps, repetition 1: another process's CPU made it look saturated
        if p.get("load") == "0.5rps" and p["config"] == "baseline" and p["repetition"] == 1:
            p.update(contaminated=True, completion_rps=0.1, late=12, slo_met=3)
    (run / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in phases))
    build_report([run])
    points = pd.read_csv(run / "rate_sweep.csv").set_index(["config", "rate_rps"])
    row = points.loc[("baseline", 0.5)]
    assert (
        not row["saturated"] and row["judged_on"] == 1 and row["repetitions"] == 2 and row["contaminated_phases"] == 1
    )
    assert pd.read_csv(run / "saturation.csv").set_index("config").loc["baseline", "saturation_rps"] == 2.0


def test_an_open_loop_only_run_takes_the_break_even_from_a_closed_loop_run_reported_with_it(tmp_path: Path) -> None:
    from harness.report.build import build_report

    sweep = _sweep_run(tmp_path)
    phases = [json.loads(x) for x in (sweep / "phases.jsonl").read_text().splitlines() if x.strip()]
    (sweep / "phases.jsonl").write_text(
        "".join(json.dumps(p) + "\n" for p in phases if p.get("load"))
    )  # open loop only
    manifest = json.loads((sweep / "manifest.json").read_text())
    (sweep / "manifest.json").write_text(json.dumps({**manifest, "run_id": "sweep"}))
    alone = pd.read_csv(build_report([sweep]).out_dir / "saturation.csv").set_index("config")
    assert alone.loc["ngram-map-k", "break_even_streams"].startswith("not measured in closed loop")
    closed = tmp_path / "closed"
    shutil.copytree(FIXTURE, closed)
    both = build_report([closed, sweep], out_dir=tmp_path / "both").tables["saturation"].set_index(["run", "config"])
    be = both.loc[("sweep", "ngram-map-k"), "break_even_streams"]
    assert "(run " in be and "sweep" not in be.split("(run ")[1]
