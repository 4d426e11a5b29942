"""Open-loop arrivals: the schedule's statistics, ``run_arrivals`` against a small SSE server, goodput, the
scenario's ``measurement.arrival`` and the verdict's open-loop columns (docs/metrics.md#open-loop-phases)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from pydantic import ValidationError

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.errors import ScenarioError
from harness.config.estimate import wall_clock_estimate
from harness.config.loader import load_scenario
from harness.config.schema import Arrival, Scenario, Stage, load_label
from harness.detect.servable import goodput, meets_slo
from harness.load.arrivals import arrival_figures, run_arrivals
from harness.load.client import RequestParams
from harness.load.schedule import Schedule, arrival_prompt_offset, rate_schedule, schedule, stages_schedule
from harness.prompts import Prompt
from harness.records.files import RequestRecord
from tests.conftest import LLAMACPP

ROOT = Path(__file__).resolve().parents[2]


# ---- the schedule -------------------------------------------------------------------------------
def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_constant_gaps_are_exactly_one_over_the_rate() -> None:
    s = rate_schedule("constant", 4.0, 100, seed=1)
    assert len(s) == 100 and s.offsets_s[0] == 0.0
    assert np.allclose(np.diff(s.offsets_s), 0.25, rtol=0, atol=1e-12)
    assert s.span_s == pytest.approx(25.0, abs=1e-9) and s.offered_rps == pytest.approx(4.0, abs=1e-9)


def test_poisson_gaps_have_mean_one_over_the_rate_and_cv_one() -> None:
    s = rate_schedule("poisson", 5.0, 200_000, seed=[3, 0, 1])
    g = np.diff(s.offsets_s)
    assert g.min() >= 0
    assert g.mean() == pytest.approx(0.2, rel=0.01)  # standard error 0.22 %
    assert _cv(g) == pytest.approx(1.0, rel=0.03)
    assert s.offered_rps == pytest.approx(5.0, rel=0.01)


@pytest.mark.parametrize("cv", [0.3, 2.5])
def test_gamma_gaps_honour_mean_and_cv(cv: float) -> None:
    s = rate_schedule("gamma", 3.0, 200_000, seed=[11, 0, 1], cv=cv)
    g = np.diff(s.offsets_s)
    assert g.mean() == pytest.approx(1 / 3.0, rel=0.03)
    assert _cv(g) == pytest.approx(cv, rel=0.05)


def test_schedule_is_seeded_the_same_in_every_call_and_differs_by_repetition_and_rate() -> None:
    a = Arrival(kind="poisson", rate_rps=[1, 2], requests=50, seed=9)
    one = schedule(a, "1rps", 1).offsets_s
    assert np.array_equal(one, schedule(a, "1rps", 1).offsets_s)  # the same phase in every configuration
    assert np.array_equal(
        one, schedule(Arrival(kind="poisson", rate_rps=[1, 2], requests=50, seed=9), "1rps", 1).offsets_s
    )
    assert not np.array_equal(one, schedule(a, "1rps", 2).offsets_s)
    assert not np.array_equal(
        one, schedule(Arrival(kind="poisson", rate_rps=[1, 2], requests=50, seed=10), "1rps", 1).offsets_s
    )
    assert not np.allclose(one * 1, schedule(a, "2rps", 1).offsets_s * 2)  # not one draw rescaled
    with pytest.raises(ValueError, match="no open-loop phase '3rps'"):
        schedule(a, "3rps", 1)


def test_prompt_offsets_tile_the_prompt_list_phase_by_phase() -> None:
    a = Arrival(kind="poisson", stages=[Stage(rate_rps=5, duration_s=2), Stage(rate_rps=1, duration_s=3)], seed=2)
    assert arrival_prompt_offset(a, 3, "stages", 1) == 0
    assert arrival_prompt_offset(a, 3, "stages", 2) == len(schedule(a, "stages", 1))
    assert arrival_prompt_offset(a, 3, "stages", 3) == len(schedule(a, "stages", 1)) + len(schedule(a, "stages", 2))
    b = Arrival(kind="constant", rate_rps=[2, 8], requests=5)
    assert [arrival_prompt_offset(b, 2, k, r) for k in ("2rps", "8rps") for r in (1, 2)] == [0, 5, 10, 15]


def test_constant_stages_run_in_order_with_their_own_rate() -> None:
    s = stages_schedule("constant", [Stage(rate_rps=2, duration_s=3), Stage(rate_rps=10, duration_s=1)], seed=0)
    # 0, 0.5, …, 2.5; then 3.0, 3.1, …, 3.9: ten, not eleven (sums of 0.1 fall just short of 1.0)
    assert np.allclose(s.offsets_s, np.concatenate((np.arange(6) * 0.5, 3 + np.arange(10) * 0.1)), atol=1e-9)
    assert s.span_s == 4.0 and s.offered_rps == pytest.approx(16 / 4)


def test_poisson_stages_count_follows_each_stage_s_rate() -> None:
    s = stages_schedule("poisson", [Stage(rate_rps=50, duration_s=20), Stage(rate_rps=5, duration_s=20)], seed=4)
    first, second = int((s.offsets_s < 20).sum()), int((s.offsets_s >= 20).sum())
    assert 1000 - 4 * 32 < first < 1000 + 4 * 32  # Poisson count: mean 1000, sd √1000 ≈ 32
    assert 100 - 4 * 10 < second < 100 + 4 * 10
    assert np.all(np.diff(s.offsets_s) >= 0) and s.offsets_s[-1] < 40
    assert np.array_equal(
        s.offsets_s,
        stages_schedule(
            "poisson", [Stage(rate_rps=50, duration_s=20), Stage(rate_rps=5, duration_s=20)], seed=4
        ).offsets_s,
    )


# ---- run_arrivals against a small OpenAI-style SSE server -----------------------------------------
# The chunks a real llama-server streamed (tests/fixtures/llamacpp/base.chat.stream.sse.txt, captured
# from llama-server build 11434): role chunk, 11 text chunks, the finish, usage, [DONE].
SSE_LINES = [
    ln
    for ln in (LLAMACPP / "base.chat.stream.sse.txt").read_text(encoding="utf-8").splitlines()
    if ln.startswith("data:")
]


class SseServer:
    """Answers every chat request with the captured stream, spread over ``hold_s``; counts requests in flight."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ln in SSE_LINES:
                await asyncio.sleep(self.hold_s / len(SSE_LINES))
                await resp.write(ln.encode() + b"\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.in_flight -= 1

    async def __aenter__(self) -> SseServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app, shutdown_timeout=2.0)  # a handler cut by its client ends at its next write
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)  # an ephemeral port
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


PROMPTS = [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"count {i}"}]) for i in range(4)]
PARAMS = RequestParams(max_tokens=12, timeout_s=20, stall_s=10)
META = {"config": "c", "phase": "arrivals", "streams": 1, "repetition": 1, "attempt": "c/arrivals/20rps/1/x"}


def _engine(url: str, tmp_path: Path) -> LlamaCpp:
    return LlamaCpp(LaunchSpec(model=Path("/m"), request_base_url=url), tmp_path / "x.server.log")


def _run(
    hold_s: float, offsets: list[float], cap: int, tmp_path: Path, stop_after_s: float | None = None
) -> tuple[list[RequestRecord], float, list[RequestRecord], int]:
    async def main() -> tuple[list[RequestRecord], float, list[RequestRecord], int]:
        async with SseServer(hold_s) as srv:
            seen: list[RequestRecord] = []
            stop = asyncio.Event()
            if stop_after_s is not None:
                asyncio.get_running_loop().call_later(stop_after_s, stop.set)
            t0 = time.perf_counter()
            recs = await run_arrivals(
                _engine(srv.url, tmp_path),
                PROMPTS,
                PARAMS,
                offsets,
                cap,
                META,
                seen.append,
                (time.time(), time.perf_counter_ns()),
                prompt_offset=1,
                stop=stop,
                late_after_s=0.1,
            )
            return recs, time.perf_counter() - t0, seen, srv.max_in_flight

    return asyncio.run(main())


def test_a_request_that_cannot_be_sent_on_time_is_recorded_late_with_its_delay(tmp_path: Path) -> None:
    offsets = [0.0, 0.05, 0.10]  # 20 rps, one slot, each answer 0.3 s
    recs, wall, seen, _ = _run(0.3, offsets, 1, tmp_path)
    assert seen == recs
    by_index = sorted(recs, key=lambda r: r.index)
    assert [r.status for r in by_index] == ["ok"] * 3 and all(
        r.chunks == 11 and r.output_tokens == 12 for r in by_index
    )
    first, second, third = by_index
    assert first.late is False and first.send_delay_s is not None and first.send_delay_s < 0.1
    # the second was due at 0.05 s and went out when the first ended (~0.3 s): late, and by how much
    assert second.late is True and second.send_delay_s is not None and 0.15 < second.send_delay_s < 1.0
    assert second.start_unix_s == pytest.approx(second.scheduled_unix_s + second.send_delay_s, abs=2e-6)
    assert second.scheduled_unix_s - first.scheduled_unix_s == pytest.approx(0.05, abs=1e-3)
    assert third.late is True and third.send_delay_s > second.send_delay_s
    assert second.start_unix_s >= first.start_unix_s + first.e2e_s - 0.01  # it waited for the slot
    assert [r.prompt_id for r in by_index] == ["p1", "p2", "p3"]  # prompt_offset 1, in schedule order
    assert {r.id for r in recs} == {f"c/arrivals/20rps/1/x/0/{i}" for i in range(3)}
    # offered vs achieved: 20 rps asked, ~3 per second delivered
    fig = arrival_figures(recs, Schedule(np.array(offsets), 0.15), wall)
    assert fig["offered_rps"] == pytest.approx(20.0) and fig["scheduled"] == 3
    assert fig["achieved_rps"] < 4.0 and fig["late"] == 2 and fig["max_send_delay_s"] == third.send_delay_s


def test_with_slots_free_requests_go_out_on_time_and_overlap(tmp_path: Path) -> None:
    recs, _, _, most = _run(0.3, [0.0, 0.05, 0.10], 3, tmp_path)
    by_index = sorted(recs, key=lambda r: r.index)
    assert [r.late for r in by_index] == [False, False, False] and all((r.send_delay_s or 0) < 0.1 for r in by_index)
    # open loop: the second was sent while the first was still streaming (a closed-loop stream would have waited)
    assert by_index[1].start_unix_s < by_index[0].start_unix_s + by_index[0].e2e_s
    assert most == 3


def test_stop_cuts_the_requests_in_flight_and_sends_no_more(tmp_path: Path) -> None:
    recs, wall, _, _ = _run(5.0, [0.0, 3.0], 2, tmp_path, stop_after_s=0.3)
    assert wall < 2.5
    assert len(recs) == 1 and recs[0].error_kind == "interrupted" and recs[0].late is False


def test_a_failing_record_writer_stops_the_phase_and_is_raised(tmp_path: Path) -> None:
    async def main() -> None:
        async with SseServer(0.05) as srv:

            def boom(_r: RequestRecord) -> None:
                raise OSError("disk full")

            await run_arrivals(
                _engine(srv.url, tmp_path),
                PROMPTS,
                PARAMS,
                [0.0, 0.02, 5.0],
                4,
                META,
                boom,
                (time.time(), time.perf_counter_ns()),
            )

    t0 = time.perf_counter()
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(main())
    assert time.perf_counter() - t0 < 3.0  # the request due at 5 s was never sent


# ---- goodput --------------------------------------------------------------------------------------
def test_goodput_counts_requests_meeting_every_bound_from_their_scheduled_time() -> None:
    # (status, ttft_s, decode_tps, e2e_s, send_delay_s)
    reqs = [
        ("ok", 0.5, 30.0, 4.0, 0.0),
        ("ok", 0.5, 30.0, 4.0, 1.8),
        ("ok", 0.5, 10.0, 4.0, None),
        ("error", None, None, 1.0, 0.0),
        ("ok", 0.5, None, 4.0, 0.0),
        ("ok", 0.2, 40.0, 9.5, 0.0),
    ]
    assert goodput(reqs, 10.0, None, None, None) == (None, None)  # no SLO: nothing to meet
    assert goodput(reqs, 10.0, None, 2.0, None) == (4, 0.4)  # the late one's TTFT counts from its scheduled time: 2.3 s
    assert goodput(reqs, 10.0, 20.0, None, None) == (3, 0.3)  # no decode t/s (one chunk): not shown to meet it
    assert goodput(reqs, 10.0, 20.0, 2.0, 5.0) == (1, 0.1)
    assert meets_slo("ok", 0.5, 30.0, 4.0, 0.0, None, None, None) and not meets_slo(
        "error", 0.5, 30.0, 4.0, 0.0, None, None, None
    )


# ---- the scenario ---------------------------------------------------------------------------------
BASE: dict[str, Any] = {"name": "s", "server": {"model": "m.gguf"}, "configurations": [{"name": "b"}]}


def _sc(measurement: dict[str, Any], **more: Any) -> Scenario:
    return Scenario.model_validate({**BASE, "measurement": measurement, **more})


def test_arrival_scenario_normalises_rates_and_keys_its_phases() -> None:
    sc = _sc({"arrival": {"rate_rps": 2}})
    assert sc.measurement.arrival is not None and sc.measurement.arrival.rate_rps == [2.0]
    assert (
        sc.measurement.phase_loads() == ["2rps"] and load_label("2rps") == "@2 rps" and load_label("stages") == "stages"
    )
    sc = _sc({"arrival": {"kind": "gamma", "cv": 2, "rate_rps": [4, 0.5], "requests": 10}, "repetitions": 2})
    assert sc.measurement.phase_loads() == ["0.5rps", "4rps"]
    est = wall_clock_estimate(sc)  # two reps of 20 s at 0.5 rps and 2.5 s at 4 rps, plus a request's time each
    assert est["measurement_s"] > 2 * (20 + 2.5)
    assert _sc({"arrival": {"stages": [{"rate_rps": 1, "duration_s": 5}]}}).measurement.phase_loads() == ["stages"]
    assert _sc({"streams": [1, 2]}).measurement.phase_loads() == [1, 2]  # closed loop as before


@pytest.mark.parametrize(
    ("measurement", "words"),
    [
        ({"streams": [1, 4], "arrival": {"rate_rps": 1}}, "remove measurement.streams"),
        ({"requests_per_stream": 3, "arrival": {"rate_rps": 1}}, "remove measurement.requests_per_stream"),
        ({"arrival": {"kind": "poisson"}}, "exactly one of 'rate_rps'"),
        ({"arrival": {"rate_rps": 1, "stages": [{"rate_rps": 1, "duration_s": 1}]}}, "exactly one of 'rate_rps'"),
        ({"arrival": {"kind": "gamma", "rate_rps": 1}}, "needs 'cv'"),
        ({"arrival": {"kind": "poisson", "cv": 2, "rate_rps": 1}}, "'cv' is for kind 'gamma'"),
        ({"arrival": {"stages": [{"rate_rps": 1, "duration_s": 1}], "requests": 5}}, "'requests' is for rate_rps"),
        ({"arrival": {"rate_rps": [2, 2.0]}}, "rates must be distinct"),
        ({"arrival": {"rate_rps": 0}}, "greater than 0"),
        ({"arrival": {"rate_rps": 1, "max_in_flight": 0}}, "greater than or equal to 1"),
        ({"arrival": {"kind": "gamma", "cv": 0, "rate_rps": 1}}, "greater than 0"),
    ],
)
def test_bad_arrival_is_refused_naming_the_field(measurement: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        _sc(measurement)


def test_bad_arrival_file_error_names_file_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: s\nserver: {model: m.gguf}\nconfigurations: [{name: b}]\nmeasurement:\n  streams: [1]\n  arrival:\n"
        "    rate_rps: 1\n"
    )
    with pytest.raises(ScenarioError) as exc:
        load_scenario(p, check_model_files=False)
    assert f"{p}:4: measurement: streams is for closed-loop phases" in str(exc.value)
    p.write_text(
        "name: s\nserver: {model: m.gguf}\nconfigurations: [{name: b}]\nmeasurement:\n  arrival:\n    kind: gamma\n"
        "    rate_rps: 1\n"
    )
    with pytest.raises(ScenarioError, match=r"s\.yaml:5: measurement\.arrival: kind 'gamma' needs 'cv'"):
        load_scenario(p, check_model_files=False)


def test_the_open_loop_example_scenario_validates() -> None:
    loaded = load_scenario(ROOT / "scenarios" / "open-loop-cpu.yaml", check_model_files=False)
    m = loaded.scenario.measurement
    assert m.arrival is not None and m.arrival.kind == "poisson" and m.phase_loads() == ["0.5rps", "2rps"]
    assert [c.name for c in loaded.scenario.runs()] == ["baseline", "ngram-map-k"]
    assert loaded.scenario.slo is not None and loaded.scenario.slo.e2e_s_max == 10


def test_plan_lists_the_open_loop_phases() -> None:
    from engines import engine_class
    from harness.run.plan import plan_lines

    loaded = load_scenario(ROOT / "scenarios" / "open-loop-cpu.yaml", check_model_files=False)
    text = "\n".join(plan_lines(loaded, engine_class("llamacpp")))
    assert (
        "open loop @0.5 rps, repetition 1: 12 requests at 0.5 rps, poisson gaps, at most 4 in flight, 64 tokens each"
        in text
    )
    assert (
        "open loop @2 rps, repetition 2:" in text and "4 streams" not in text
    )  # no closed-loop phase (the default streams: [1, 4])


# ---- the verdict's open-loop columns ------------------------------------------------------------------
FIXTURE = ROOT / "tests" / "fixtures" / "run_quick"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_verdict_shows_offered_achieved_goodput_and_late_per_rate(tmp_path: Path) -> None:
    from harness.report.build import build_report

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    before = build_report([run]).display
    phases, requests = _jsonl(run / "phases.jsonl"), []
    closed = list(phases)
    for cfg, achieved, goodput_rps, late in (("baseline", 1.5, 1.2, 3), ("ngram-map-k", 1.9, 1.6, 0)):
        template = next(p for p in closed if p["config"] == cfg)
        for rep in (1, 2):
            attempt = f"{cfg}/arrivals/2rps/{rep}/abc"
            phases.append(
                {
                    **template,
                    "phase": "arrivals",
                    "streams": 4,
                    "repetition": rep,
                    "attempt": attempt,
                    "load": "2rps",
                    "requests": 2,
                    "ok": 2,
                    "errors": 0,
                    "output_tokens": 0,
                    "counters": {
                        **template["counters"],
                        "output_tokens": 0,
                        "draft_tokens": 0,
                        "accepted_tokens": 0,
                        "verify_steps": 0,
                    },
                    "client_draft_tokens": None,
                    "client_accepted_tokens": None,
                    "scheduled": 20,
                    "offered_rps": 2.0 if rep == 1 else 2.04,
                    "achieved_rps": achieved,
                    "goodput_rps": goodput_rps,
                    "slo_met": 12,
                    "late": late,
                    "max_send_delay_s": 0.8 * rep if late else 0.0,
                }
            )
            requests += [
                {
                    "config": cfg,
                    "phase": "arrivals",
                    "streams": 4,
                    "repetition": rep,
                    "stream": 0,
                    "index": i,
                    "prompt_id": "x",
                    "status": "ok",
                    "start_unix_s": 1.0,
                    "attempt": attempt,
                    "id": f"{attempt}/0/{i}",
                    "scheduled_unix_s": 1.0,
                    "send_delay_s": 0.0,
                    "late": False,
                }
                for i in range(2)
            ]
    (run / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in phases))
    with open(run / "requests.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in requests)
    rep = build_report([run])
    shown = rep.display.set_index("configuration")
    assert shown.loc["baseline", "offered / achieved rps @2 rps"] == "2.02 / 1.50"  # medians over the two repetitions
    assert shown.loc["ngram-map-k", "goodput rps @2 rps"] == "1.60"
    assert (
        shown.loc["baseline", "late @2 rps"] == "6/40 (max 1.60 s)"
        and shown.loc["ngram-map-k", "late @2 rps"] == "0/40"
    )
    assert shown.loc["draft-self-k3", "offered / achieved rps @2 rps"] == "– / –"  # not measured open-loop
    # the closed-loop columns are what they were: open-loop phases are not a stream count
    kept = [c for c in before.columns if c not in ("failures", "engine agreement")]
    assert rep.display[kept].equals(before[kept])
    assert "request records read" not in rep.display.columns  # every open-loop record found by its attempt
    assert "Open-loop phases" in rep.markdown.read_text()
