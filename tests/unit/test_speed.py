"""The speed index (harness/soak/speed.py): an engine's tokens against what it streams at the concurrency it had.

On an engine simulated with a known curve it is 1 at any load and 0.5 at half speed; replayed through the window
assembly and the change detector over real soaks' records (tests/fixtures/soak_records), it gives no verdict on the
two-hour healthy soak while judging the windows of every load level, and a collapse at the real planted slowdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bench.speed_replay import rejudged
from harness.config.schema import Watchdog
from harness.detect.changepoint import ChangeDetector, DetectorSettings, detect_series
from harness.soak.assemble import replay_speed
from harness.soak.coverage import coverage
from harness.soak.slice import SETTLE_WINDOWS, detector_settings
from harness.soak.speed import Span, SpeedModel, spans_of, speed_figures, speed_index
from harness.soak.watchdog import change_finding

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "soak_records"


def simulate(
    rates: list[tuple[float, float]],
    beta: float,
    t1: float = 40.0,
    prefill_s: float = 0.4,
    slow_from: float = 1e9,
    slow: float = 0.5,
    slots: int = 10**9,
    at: list[float] | None = None,
) -> list[dict[str, Any]]:
    """Request records of an engine whose streams decode at ``t1 * k**beta / k`` tokens/s each while k decode, and
    stall while a prompt is processed (``prefill_s`` each, one at a time, before the first token); ``slow`` as fast in
    every respect from ``slow_from``. ``rates``: Poisson stages (rps, seconds), or ``at``: the arrival times; at most
    ``slots`` requests in flight (the client's max_in_flight on the server's slots: the others are sent when one ends,
    their start then). 96-token answers; 10-ms steps."""
    rng = np.random.default_rng(7)
    arrivals, t = [], 0.0
    for rps, span in rates:
        end = t + span
        while (t := t + rng.exponential(1 / rps)) < end:
            arrivals.append(t)
        t = end
    if at is not None:
        arrivals = sorted(at)
    dt, now, recs = 0.01, 0.0, []
    queue: list[dict[str, Any]] = []
    prefilling: dict[str, Any] | None = None
    decoding: list[dict[str, Any]] = []
    pending = list(arrivals)
    while pending or queue or prefilling or decoding:
        speed = slow if now >= slow_from else 1.0
        while pending and pending[0] <= now and len(queue) + len(decoding) + (prefilling is not None) < slots:
            queue.append({"start": max(pending.pop(0), now), "left": 96.0})
        if prefilling is None and queue:
            prefilling = {**queue.pop(0), "work": prefill_s}
        if prefilling is not None:
            prefilling["work"] -= dt * speed
            if prefilling["work"] <= 0:
                prefilling["first"] = now + dt
                prefilling["left"] -= 1
                decoding.append(prefilling)
                prefilling = None
        elif decoding:
            k = len(decoding)
            for r in decoding:
                r["left"] -= dt * speed * t1 * k**beta / k
        now += dt
        for r in [r for r in decoding if r["left"] <= 0]:
            decoding.remove(r)
            recs.append(
                {
                    "status": "ok",
                    "start_unix_s": 1e6 + r["start"],
                    "ttft_s": r["first"] - r["start"],
                    "e2e_s": now - r["start"],
                    "output_tokens": 96,
                }
            )
    return recs


def windows_of(recs: list[dict[str, Any]], window_s: float) -> list[tuple[float, float]]:
    end = max(r["start_unix_s"] + r["e2e_s"] for r in recs)
    return [(t, t + window_s) for t in np.arange(1e6, end, window_s)]


def _indices(recs: list[dict[str, Any]], model: SpeedModel, learn: int) -> list[float | None]:
    """Each 60-s window's index as the slice builds it (its first ``learn`` windows teach the model)."""
    spans = spans_of(recs)
    out = []
    for t0, t1 in windows_of(recs, 60.0):
        out.append(speed_figures({"t_start_unix": t0, "t_end_unix": t1}, spans, model, learn, False)["speed_index"])
    return out


def test_an_engine_at_its_own_speed_is_about_one_at_every_load_and_half_when_halved() -> None:
    # an engine whose total rate does not grow with streams (beta 0, as llama-server on this CPU: the two-hour soak's
    # records fit beta 0), learned at a light rate (mostly one stream, seldom a prompt), judged at three times it,
    # where up to 11 streams share the engine and prompts stall them
    light, heavy = (0.08, 600.0), (0.25, 600.0)
    recs = simulate([light, heavy], beta=0.0)
    first = SpeedModel()
    for t0, t1 in windows_of(recs, 60.0)[:8]:
        first.learn(spans_of(recs), t0, t1)
    assert first.t1 == pytest.approx(40.0, rel=0.05) and first.rho == 0.0, first.to_dict()
    busy = [speed_index(spans_of(recs), t0, t1, first) for t0, t1 in windows_of(recs, 60.0)[11:19]]
    assert all(s is not None and s.k_max >= 3 and 0.95 < s.index < 1.05 for s in busy), [s and s.index for s in busy]
    # as the soak learns, and the same load on an engine at half speed from 100 s into the busier stage
    model = SpeedModel()
    assert all(0.95 < v < 1.05 for v in _indices(recs, model, 8) if v is not None)
    slowed = _indices(simulate([light, heavy], beta=0.0, slow_from=700.0), SpeedModel(), 8)
    assert all(0.4 < v < 0.6 for v in slowed[12:19] if v is not None), slowed


def test_a_window_of_two_requests_that_disagree_weighs_little_and_one_of_ten_as_its_count_says() -> None:
    # a healthy diurnal trough's window of two requests read 0.56 against 1.11 (bench/real_path.py, seed 4): the sd the
    # two imply is itself a guess, widened as Student's t widens a mean of two (x 6.5), so the window weighs little
    recs = simulate([(0.08, 600.0)], beta=0.0)
    model = SpeedModel()
    for t0, t1 in windows_of(recs, 60.0)[:8]:
        model.learn(spans_of(recs), t0, t1)
    t0 = 2e6

    def alone(n: int) -> list[Span]:  # requests one after another, 2 s each, at the curve's speed and at half of it
        return [Span(t0 + 5 * i, t0 + 5 * i + 0.1, t0 + 5 * i + 2.1, 80.0 if i % 2 else 40.0) for i in range(n)]

    two, ten = speed_index(alone(2), t0, t0 + 60, model), speed_index(alone(10), t0, t0 + 60, model)
    assert two is not None and ten is not None
    assert two.index == pytest.approx(0.75, abs=0.02) and ten.index == pytest.approx(0.75, abs=0.02)
    # their own standard errors: 0.25 and 0.083 of the index; widened to 1.6 and 0.096
    assert two.sd > 1.0 and ten.sd < 0.15, (two.sd, ten.sd)


def test_a_concurrency_never_learned_is_predicted_as_a_lower_bound() -> None:
    # an engine whose total rate grows with streams (beta 0.5): past the largest concurrency learned the model takes the
    # total rate as flat, so a healthy engine reads at least 1 there, and a halved one reads low, though less than half
    light, heavy = (0.08, 600.0), (0.25, 600.0)
    healthy = _indices(simulate([light, heavy], beta=0.5), SpeedModel(), 8)
    assert all(v > 0.9 for v in healthy if v is not None), healthy
    slowed = _indices(simulate([light, heavy], beta=0.5, slow_from=700.0), SpeedModel(), 8)
    assert float(np.median([v for v in slowed[12:18] if v is not None])) < 0.85, slowed


def test_the_curve_starts_from_the_measurement_phases_so_an_engine_slow_from_the_start_reads_slow() -> None:
    # the fresh engine measured before the soak (one phase of light traffic, as the measurement's 1-stream phase), then a
    # soak on an engine at half speed from its first second: learned from the soak alone, the slowed engine is its own
    # curve (about 1); started from the measurement, the soak's first windows read about half
    measured = [
        {**r, "config": "c", "phase": "measure", "streams": 1, "repetition": 1, "attempt": "c/measure/1/1/x"}
        for r in simulate([(0.1, 600.0)], beta=0.0)
    ]
    warm = [{**r, "phase": "warmup"} for r in simulate([(0.1, 120.0)], beta=0.0, slow_from=0.0)]
    model = SpeedModel.from_phases(measured + warm)  # the warm-up is not learned
    assert model.phases == 1 and model.windows == 0 and model.t1 == pytest.approx(40.0, rel=0.05), model.to_dict()
    slowed = simulate([(0.1, 600.0)], beta=0.0, slow_from=0.0)
    alone = _indices(slowed, SpeedModel(), 5)
    seeded = _indices(slowed, model, 5)
    assert all(0.9 < v < 1.1 for v in alone if v is not None), alone
    # every window reads half: a soak window far below the measured curve does not refine it (it would become it)
    assert all(v is not None and 0.4 < v < 0.6 for v in seeded), seeded
    assert model.windows == 0 and model.phases == 1
    # a healthy engine's windows do refine it
    healthy = SpeedModel.from_phases(measured)
    assert all(0.9 < v < 1.1 for v in _indices(simulate([(0.1, 600.0)], beta=0.0), healthy, 5) if v is not None)
    assert healthy.windows >= 5  # its first five, then a window at a concurrency not learned before


def _phase(streams: int, beta: float) -> list[dict[str, Any]]:
    """A closed-loop measurement phase on the fresh engine: ``streams`` streams, two requests each."""
    return [
        {**r, "config": "c", "phase": "measure", "streams": streams, "repetition": 1, "attempt": f"c/measure/{streams}"}
        for r in simulate([], beta, slots=streams, at=[0.0] * (2 * streams))
    ]


def test_a_level_the_measurement_measured_is_the_curve_so_a_slowdown_met_first_there_reads_half() -> None:
    # the live level-change plant (tests/long/test_soak_plants.py, 2026-12-05): an engine whose total rate grows with
    # streams (beta 0.5), four in flight at most, 0.08 rps then 0.5, halved as the busier stage begins. Measured at one
    # stream only, the busier level is past the curve, whose lower bound reads the halved engine at about 1, and the
    # soak learns it as that level's speed; measured at 1 and 4 streams (the default), the level is known: half.
    light, heavy = (0.08, 600.0), (0.5, 600.0)
    slowed = simulate([light, heavy], beta=0.5, slots=4, slow_from=600.0)
    blind = SpeedModel.from_phases(_phase(1, 0.5))
    assert blind.k_max == 1
    assert float(np.median([v for v in _indices(slowed, blind, 5)[11:20] if v is not None])) > 0.9
    model = SpeedModel.from_phases(_phase(1, 0.5) + _phase(4, 0.5))
    # four streams decoded together for seconds, not MIN_LEVEL_S, in the phase: learned, as the fresh engine's own
    assert model.k_max == 4 and model.beta == pytest.approx(0.5, abs=0.1), model.to_dict()
    after = [v for v in _indices(slowed, model, 5)[11:20] if v is not None]
    assert len(after) == 9 and all(0.4 < v < 0.6 for v in after), after
    healthy = _indices(
        simulate([light, heavy], beta=0.5, slots=4), SpeedModel.from_phases(_phase(1, 0.5) + _phase(4, 0.5)), 5
    )
    assert all(0.9 < v < 1.1 for v in healthy if v is not None), healthy


def test_a_first_window_past_the_measured_streams_teaches_the_curve_only_when_it_is_not_slow() -> None:
    # measured at one stream; the soak's first windows decode up to four streams on an engine at 82% of its speed from
    # the start: past the curve's measured streams a first window must reach LEARN_ABOVE (0.9), not 0.75, to extend it
    slowed = simulate([(0.35, 400.0)], beta=0.0, slots=4, slow_from=0.0, slow=0.82)
    model = SpeedModel.from_phases(_phase(1, 0.0))
    read = [v for v in _indices(slowed, model, 5) if v is not None]
    assert model.windows == 0 and model.k_max == 1, model.to_dict()
    assert all(0.75 < v < 0.9 for v in read), read


def _fixture(name: str) -> tuple[Watchdog, list[dict[str, Any]], list[dict[str, Any]]]:
    sc = yaml.safe_load((RECORDS / name / "scenario.yaml").read_text())
    read = lambda f: [json.loads(line) for line in (RECORDS / name / f).read_text().splitlines()]
    return Watchdog(**sc["soak"]["watchdog"]), read("windows.jsonl"), read("requests.jsonl")


def test_the_two_hour_healthy_soak_gives_no_verdict_and_its_speed_is_judged_at_every_load() -> None:
    """The second two-hour soak (fixture alone_2h: 0.15 -> 0.25 -> 0.2 -> 0.15 rps, 47 one-minute windows per
    configuration, 1,138 request records): as its windows were judged, 4 and 4 of 47 were (load settling, level
    changing, contaminated); with the speed index rebuilt from its records, every window after the warm-up that has a
    curve is judged (against 1 until the index's reference is built), at every level, across level changes and in contaminated windows, and nothing
    is a collapse. The index of a healthy engine stayed within 0.8 and 1.6 (median about 1.05)."""
    wd, windows, recs = _fixture("alone_2h")
    settings = detector_settings(wd)
    for config in ("baseline", "ngram-map-k"):
        mine = [w for w in windows if w["config"] == config]
        before = coverage(mine)
        assert before.judged <= 8, before.sentence(config)
        rebuilt = replay_speed(mine, [r for r in recs if r["config"] == config], settings, SETTLE_WINDOWS * wd.window_s)
        assert [e for e in detect_series(rebuilt, settings) if e.kind == "collapse"] == []
        values = [w["speed_index"] for w in rebuilt if w["speed_index"] is not None]
        assert min(values) > 0.8 and max(values) < 1.6 and 0.95 < float(np.median(values)) < 1.15, values
        after = coverage(rebuilt)  # judged as the slice judges them
        # from the first window after the warm-up whose curve knows one request's spread, the index is judged against
        # its prior (1) until its reference is built. This fixture has no measurement records, so the soak's own first
        # clean windows are the curve: not judged are three contaminated windows before it was learned and the first
        # learned one (9 requests, under MIN_SPREAD_ROWS)
        assert after.judged == after.windows - wd.warmup_windows - 4, after.sentence(config)
        # every level judged, the changing windows too; the first level holds the warm-up and the curve's windows
        assert all(j >= 0.8 * n for lv, (j, n) in after.by_level.items() if lv != "~0.149 rps"), after.sentence(config)
        assert after.by_metric["speed_index"][0] > 4 * before.judged, after.sentence(config)


def test_the_real_planted_slowdown_is_a_collapse_of_the_speed_index_in_the_window_it_began() -> None:
    """tests/long/test_soak_alone.py's run (fixture alone_planted): llama-server frozen for 60% of every 0.2 s once the
    first window was judged, at 0.3 rps. The index read 0.94-1.04 before and 0.38-0.46 after; the collapse starts in
    the first slowed window and is decided by the second, and no window before it departs."""
    wd, windows, recs = _fixture("alone_planted")
    settings = DetectorSettings(wd.warmup_windows, wd.reference_windows, wd.confirm_windows)
    rebuilt = replay_speed(windows, recs, settings, SETTLE_WINDOWS * wd.window_s)
    slowed = next(i for i, w in enumerate(windows) if (w["alone_decode_tps"] or 99) < 50)
    before = [w["speed_index"] for w in rebuilt[:slowed] if w["speed_index"] is not None]
    after = [w["speed_index"] for w in rebuilt[slowed:]]
    assert min(before) > 0.9 and all(v is not None and v < 0.5 for v in after), (before, after)
    events = [e for e in detect_series(rebuilt, settings) if e.metric == "speed_index"]
    assert [e.kind for e in events] == ["collapse"]
    assert events[0].onset_unix == windows[slowed]["t_unix"] and events[0].t_unix == windows[slowed + 1]["t_unix"]


def _steady(i: int, value: float, **over: Any) -> dict[str, Any]:
    return {
        "t_unix": 1e6 + 60 * i,
        "load_level": 3,
        "load_settled": True,
        "speed_index": value,
        "output_tps": 50.0,
        **over,
    }


def test_a_figure_made_for_any_load_is_judged_where_the_load_moves_and_other_processes_take_the_cpu() -> None:
    det = ChangeDetector(DetectorSettings(warmup_windows=0, reference_windows=5, confirm_windows=2))
    for i in range(8):
        det.update(_steady(i, 1.0 + 0.02 * (i % 3), count_sd={"speed_index": 0.05}))
    for i, over in enumerate([{"load_level": None}, {"draining": True}, {"backlog_inherited": True}], start=8):
        det.update(_steady(i, 1.0, output_tps=5.0, **over))
        assert det.judged() == (True, None)
        state = det.state()
        assert state["speed_index"].relative_change is not None and state["output_tps"].relative_change is None
    # contaminated: judged, not learned from; a slowed engine there is a collapse the watchdog only records, saying why
    events = []
    for i in range(12, 15):
        cpu = {"other_cores": 0.4}
        w = _steady(i, 0.5, contaminated=True, cpu=cpu)
        events += det.update(w)
    assert [(e.kind, e.metric) for e in events] == [("collapse", "speed_index")]
    wd = Watchdog(window_s=60, confirm_windows=2)
    history = [_steady(i, 0.5, contaminated=True, cpu={"other_cores": 0.4}) for i in range(12, 15)]
    finding = change_finding(events[0], history, wd, open_loop=True)
    assert finding.action == "record" and "other processes took up to 0.40 cores" in finding.message
    clean = change_finding(events[0], [_steady(i, 0.5) for i in range(3)], wd, open_loop=True)
    assert clean.action is None and "other processes" not in clean.message


def test_the_live_slowdown_at_the_busier_level_is_judged_only_through_the_speed_index() -> None:
    """tests/long/test_soak_speed.py's run (fixture speed_planted, 2026-12-05): Poisson 0.2 then 1.2 rps, llama-server
    frozen for half of every 0.2 s once three windows of the busier stage were judged. Live, the index read 1.08-1.32 there before
    and 0.62-0.66 after, a collapse of -40% from the first slowed window (recorded, as the test asks). Without the
    speed index the same windows give no verdict at all and 5 of 14 are judged; rebuilt from the request records
    through the path the slice runs, every window's index is the live one."""
    wd, windows, recs = _fixture("speed_planted")
    settings = detector_settings(wd)
    rebuilt = replay_speed(windows, recs, settings, SETTLE_WINDOWS * wd.window_s)
    assert [w.get("speed_index") for w in rebuilt] == pytest.approx([w.get("speed_index") for w in windows])
    slowed = next(i for i, w in enumerate(windows) if (w.get("speed_index") or 9) < 0.75)
    events = detect_series(windows, settings)
    assert [(e.kind, e.metric) for e in events] == [("collapse", "speed_index")]
    assert events[0].onset_unix == windows[slowed]["t_unix"] and events[0].relative_change < -0.3
    blind = [{k: v for k, v in w.items() if k != "speed_index"} for w in windows]
    assert detect_series(blind, settings) == []
    with_index, without = coverage(rejudged(wd, windows)), coverage(rejudged(wd, blind))
    assert without.judged <= 5 and with_index.judged >= 10, (without.sentence("-"), with_index.sentence("+"))
    busy = [lv for lv in with_index.by_level if lv not in ("changing",) and not lv.startswith("~0.1")]
    assert busy and all(j == n for lv, (j, n) in with_index.by_level.items() if lv in busy), with_index.sentence("+")


def test_a_collapse_in_windows_the_hypervisor_stole_from_names_the_steal() -> None:
    det = ChangeDetector(DetectorSettings(warmup_windows=0, reference_windows=5, confirm_windows=2))
    for i in range(8):
        det.update(_steady(i, 1.0 + 0.02 * (i % 3), count_sd={"speed_index": 0.05}))
    cpu = {"other_cores": 0.01, "steal_cores": 0.3}
    history = [_steady(i, 0.5, contaminated=True, cpu=cpu) for i in range(8, 11)]
    events = [e for w in history for e in det.update(w)]
    finding = change_finding(events[0], history, Watchdog(window_s=60, confirm_windows=2), open_loop=True)
    assert finding.action == "record" and "the hypervisor up to 0.30 (steal)" in finding.message, finding.message


def test_a_collapse_judged_against_the_prior_is_recorded_and_says_so() -> None:
    # the soak's first windows against the curve the measurement drew: the soak's requests may decode slower than the
    # measurement's, so a collapse before the soak has its own reference is said and recorded, not acted on
    det = ChangeDetector(DetectorSettings(warmup_windows=1, reference_windows=5, confirm_windows=2))
    events = []
    for i in range(4):
        events += det.update(_steady(i, 1.0 if i == 0 else 0.5, speed_index_prior=1.0))
    assert [(e.kind, e.metric, e.prior) for e in events] == [("collapse", "speed_index", True)]
    wd = Watchdog(window_s=60, confirm_windows=2)
    measured = {"speed": {"model": {"phases": 2}}}  # the curve began on two measurement phases
    finding = change_finding(events[0], [_steady(i, 0.5, **measured) for i in range(3)], wd, open_loop=True)
    assert finding.action == "record" and "against the curve the measurement drew" in finding.message
    assert finding.evidence["prior"] is True
    # a curve the soak's own first windows drew (no measurement records: a soak-only pod, a replayed fixture) says so
    own = change_finding(events[0], [_steady(i, 0.5) for i in range(3)], wd, open_loop=True)
    assert "against the curve the soak's first learned windows drew" in own.message, own.message
    # after the soak's own reference, the same fall is acted on (the policy's action)
    det = ChangeDetector(DetectorSettings(warmup_windows=1, reference_windows=5, confirm_windows=2))
    events = []
    for i in range(10):
        events += det.update(_steady(i, 1.0 if i < 7 else 0.5, speed_index_prior=1.0))
    assert [e.prior for e in events] == [False]
    late = change_finding(events[0], [_steady(i, 0.5) for i in range(3)], wd, open_loop=True)
    assert late.action is None and "measurement drew" not in late.message and "prior" not in late.evidence
