"""The open-loop soak without Locust (harness/load/pacing.py): the schedule over the rate curve, slices that agree
with the whole soak, the window figures (offered, late, goodput), the scenario's rules, the Parquet twin and the
exporter's gauges. The real Locust run is tests/integration/test_soak_open_loop.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from engines.llamacpp import LlamaCpp
from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario
from harness.config.schema import SoakArrival
from harness.load.pacing import window_traffic
from harness.load.schedule import (
    BATCH,
    cumulative,
    in_flight_share,
    inverse,
    rate_at,
    soak_offsets,
    window_level,
    worker_share,
)
from harness.records.columnar import compacted
from harness.records.types import Manifest
from tests.unit.test_exporter import LAB, _soak_exporter, _window
from tests.unit.test_scenario import GOOD, write


def _arrival(**kw: object) -> dict[str, object]:
    return SoakArrival(**kw).model_dump()  # type: ignore[arg-type]  # **kw: the test's own fields


def test_a_poisson_soak_schedule_has_exponential_gaps_at_the_asked_rate() -> None:
    a = _arrival(kind="poisson", rate_rps=2.0, seed=3)
    t = soak_offsets(a, 0.0, 3000.0, 3000.0)
    assert t[0] == 0.0 and np.all(np.diff(t) > 0)
    assert abs(len(t) - 6000) < 4 * np.sqrt(6000)
    assert stats.kstest(np.diff(t), "expon", args=(0, 0.5)).pvalue > 0.01
    assert stats.kstest(np.diff(t), "expon", args=(0, 0.4)).pvalue < 1e-6  # the test can tell a wrong rate


def test_gamma_gaps_have_the_asked_coefficient_of_variation_and_constant_gaps_none() -> None:
    g = np.diff(soak_offsets(_arrival(kind="gamma", rate_rps=10.0, cv=2.0, seed=1), 0.0, 2000.0, 2000.0))
    assert g.mean() == pytest.approx(0.1, rel=0.05) and g.std() / g.mean() == pytest.approx(2.0, rel=0.1)
    c = soak_offsets(_arrival(kind="constant", rate_rps=4.0), 0.0, 10.0, 10.0)
    assert np.allclose(c, np.arange(40) * 0.25)


def test_a_slice_gets_exactly_the_arrivals_the_whole_soak_has_there() -> None:
    """Slices (and a resumed soak) draw from the start with the same seed: no arrival lost, moved or doubled, even
    past one batch of gaps."""
    a = _arrival(kind="poisson", rate_rps=50.0, seed=9)
    whole = soak_offsets(a, 0.0, 2000.0, 2000.0)
    assert len(whole) > BATCH
    parts = [soak_offsets(a, s, e, 2000.0) for s, e in ((0.0, 700.0), (700.0, 1400.0), (1400.0, 2000.0))]
    assert np.array_equal(np.concatenate(parts), whole)


def test_stages_cycle_over_the_soak() -> None:
    a = _arrival(kind="constant", stages=[{"rate_rps": 1.0, "duration_s": 10.0}, {"rate_rps": 3.0, "duration_s": 5.0}])
    t = soak_offsets(a, 0.0, 45.0, 45.0)
    counts, _ = np.histogram(t, bins=[0, 10, 15, 25, 30, 40, 45])
    assert counts.tolist() == [10, 15, 10, 15, 10, 15]
    assert rate_at(a, 12.0, 45.0) == 3.0 and rate_at(a, 16.0, 45.0) == 1.0 and rate_at(a, 44.0, 45.0) == 3.0


def test_a_diurnal_curve_asks_its_integral_trough_at_midnight_peak_at_noon() -> None:
    a = _arrival(kind="constant", rate_rps=5.0, curve="diurnal", trough_rps=1.0, period_s=100.0)
    t = soak_offsets(a, 0.0, 200.0, 200.0)
    assert abs(len(t) - cumulative(a, 200.0, 200.0)) <= 1 and cumulative(a, 200.0, 200.0) == pytest.approx(600.0)
    night, noon = np.count_nonzero(t < 10), np.count_nonzero((t >= 45) & (t < 55))
    assert night < 15 and noon > 45
    x = np.linspace(0, 199, 50)
    assert np.allclose(inverse(a, cumulative(a, x, 200.0), 200.0), x, atol=1e-3)
    assert SoakArrival(rate_rps=5.0, curve="diurnal", trough_rps=1.0).mean_rps(3600.0) == pytest.approx(3.0)


def test_workers_split_the_arrivals_and_the_in_flight_cap() -> None:
    shares = [worker_share(10, i, 3) for i in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(10))
    assert [in_flight_share(8, i, 3) for i in range(3)] == [3, 3, 2]
    assert in_flight_share(1, 2, 3) == 1  # every worker can send


def test_window_figures_count_offered_late_and_goodput() -> None:
    a = _arrival(kind="constant", stages=[{"rate_rps": 1.0, "duration_s": 10.0}, {"rate_rps": 4.0, "duration_s": 10.0}])
    sched = soak_offsets(a, 0.0, 20.0, 20.0)
    recs = [
        {"status": "ok", "ttft_s": 0.1, "e2e_s": 1.0, "decode_tps": 30.0, "send_delay_s": 0.0, "late": False},  # meets
        {
            "status": "ok",
            "ttft_s": 0.1,
            "e2e_s": 1.0,
            "decode_tps": 30.0,
            "send_delay_s": 1.5,
            "late": True,
        },  # late: 2.5 s > 2
        {
            "status": "ok",
            "ttft_s": 0.1,
            "e2e_s": 1.9,
            "decode_tps": 30.0,
            "send_delay_s": 0.05,
            "late": True,
        },  # 1.95 s: meets
        {"status": "error", "ttft_s": None, "e2e_s": None, "send_delay_s": 0.0, "late": False},
    ]
    w = window_traffic(recs, 5.0, (None, None, 2.0), a, sched, (5.0, 10.0), 20.0)
    assert w["achieved_rps"] == pytest.approx(3 / 5) and w["slo_met"] == 2 and w["goodput_rps"] == pytest.approx(2 / 5)
    assert w["scheduled"] == 5 and w["offered_rps"] == pytest.approx(1.0) and w["asked_rps"] == pytest.approx(1.0)
    assert (
        w["late"] == 2
        and w["max_send_delay_s"] == 1.5
        and w["load_level"] == window_level(a, 5.0, 10.0, 20.0) is not None
    )
    across = window_traffic(recs, 5.0, (None, None, 2.0), a, sched, (8.0, 13.0), 20.0)
    assert across["load_level"] is None and across["asked_rps"] == pytest.approx((2 * 1 + 3 * 4) / 5)
    drain = window_traffic(recs, 5.0, (None, None, 2.0), a, sched, (20.0, 20.0), 20.0)  # after the slice's schedule
    assert drain["asked_rps"] is None and drain["offered_rps"] is None and drain["scheduled"] == 0
    closed = window_traffic(recs, 5.0, (None, None, None))  # closed loop, no per-request SLO
    assert closed == {"achieved_rps": pytest.approx(3 / 5), "slo_met": None, "goodput_rps": None}


BAD = [
    (
        "shape and arrival",
        "  shape: {kind: steady, users: 2}\n  arrival: {rate_rps: 1}\n",
        "soak.shape (closed-loop users) and soak.arrival",
    ),
    (
        "diurnal without trough",
        "  arrival: {rate_rps: 2, curve: diurnal}\n",
        "curve 'diurnal' needs 'rate_rps' (the peak) and 'trough_rps'",
    ),
    (
        "trough above peak",
        "  arrival: {rate_rps: 2, curve: diurnal, trough_rps: 3}\n",
        "trough_rps (3) is above the peak rate_rps (2)",
    ),
    ("period without diurnal", "  arrival: {rate_rps: 2, period_s: 60}\n", "period_s is for curve 'diurnal'"),
    (
        "rate and stages",
        "  arrival: {rate_rps: 2, stages: [{rate_rps: 1, duration_s: 5}]}\n",
        "set exactly one of 'rate_rps'",
    ),
    ("gamma without cv", "  arrival: {kind: gamma, rate_rps: 2}\n", "kind 'gamma' needs 'cv'"),
    ("absurd count", "  arrival: {rate_rps: 100000}\n", "more than 50,000,000"),
]


@pytest.mark.parametrize(("label", "soak", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_soak_arrivals_name_the_field(tmp_path: Path, label: str, soak: str, expected: str) -> None:
    path = write(tmp_path, GOOD + "soak:\n  duration_s: 3600\n" + soak)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, LlamaCpp.methods)
    msg = str(info.value)
    assert expected in msg and ": soak" in msg, msg


def test_a_good_open_loop_soak_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        GOOD
        + "soak:\n  duration_s: 3600\n  arrival: {kind: gamma, cv: 2, rate_rps: 3, curve: diurnal, trough_rps: 0.5}\n",
    )
    soak = load_scenario(path, LlamaCpp.methods).scenario.soak
    assert soak is not None and soak.arrival is not None and soak.load_kind() == "open-loop gamma"


def test_the_soak_parquet_keeps_the_open_loop_fields(tmp_path: Path) -> None:
    base = {
        "config": "c",
        "phase": "soak",
        "streams": 1,
        "repetition": 0,
        "stream": 0,
        "index": 0,
        "prompt_id": "p",
        "status": "ok",
        "start_unix_s": 10.0,
    }
    lines = [
        {**base, "scheduled_unix_s": 9.5, "send_delay_s": 0.5, "late": True},
        {**base, "scheduled_unix_s": 10.0, "send_delay_s": 0.0, "late": False},
        {**base, "scheduled_unix_s": None, "send_delay_s": None, "late": None},
    ]
    fast = tmp_path / "fast.jsonl"
    fast.write_text("".join(json.dumps(r) + "\n" for r in lines))
    slow = tmp_path / "slow.jsonl"  # a line that is not an object: the forgiving reader, which casts cell by cell
    slow.write_text(fast.read_text() + "null\n")
    for src in (fast, slow):
        t = pq.read_table(compacted(src)).to_pydict()
        assert (
            t["late"] == [True, False, None]
            and t["send_delay_s"] == [0.5, 0.0, None]
            and t["scheduled_unix_s"] == [9.5, 10.0, None]
        ), src.name


def test_the_exporter_serves_an_open_loop_windows_rates_and_late_sends() -> None:
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_window(
        _window(
            users=None,
            achieved_rps=1.5,
            slo_met=60,
            goodput_rps=1.0,
            asked_rps=2.0,
            scheduled=118,
            offered_rps=1.97,
            late=7,
            max_send_delay_s=3.25,
            load_level=7,
        )
    )
    for name, want in (
        ("specsoak_soak_achieved_requests_per_second", 1.5),
        ("specsoak_soak_goodput_requests_per_second", 1.0),
        ("specsoak_soak_asked_requests_per_second", 2.0),
        ("specsoak_soak_offered_requests_per_second", 1.97),
        ("specsoak_soak_late_requests", 7.0),
        ("specsoak_soak_max_send_delay_seconds", 3.25),
    ):
        assert get(name, LAB) == pytest.approx(want), name
    exp.on_window(
        _window(achieved_rps=2.0, slo_met=None, goodput_rps=None)
    )  # closed loop, no per-request SLO: absent, not 0
    assert get("specsoak_soak_achieved_requests_per_second", LAB) == 2.0
    for name in (
        "specsoak_soak_goodput_requests_per_second",
        "specsoak_soak_offered_requests_per_second",
        "specsoak_soak_late_requests",
        "specsoak_soak_max_send_delay_seconds",
    ):
        assert get(name, LAB) is None, name


def test_the_before_and_after_table_pairs_open_loop_phases_by_rate(tmp_path: Path) -> None:
    import pandas as pd

    from harness.report.load import RunData
    from harness.report.tables.soak import after_soak_table

    def phase(
        load: str, tps: float, achieved: float, goodput: float, late: int, where: str = "arrivals"
    ) -> dict[str, object]:
        return {
            "config": "base",
            "phase": where,
            "load": load,
            "streams": 4,
            "repetition": 1,
            "total_tps": tps,
            "achieved_rps": achieved,
            "goodput_rps": goodput,
            "late": late,
            "attempt": f"{where}-{load}",
            "engine_uptime_s": 7200.0,
            "counters": {},
        }

    before = pd.DataFrame([phase("1rps", 40.0, 1.0, 1.0, 0), phase("8rps", 90.0, 2.0, 0.5, 20)])
    after = [phase("1rps", 38.0, 0.98, 0.9, 0, "after_soak"), phase("8rps", 70.0, 1.5, 0.2, 30, "after_soak")]
    run = RunData(
        run_dir=tmp_path,
        manifest=Manifest(run_id="r"),
        phases=pd.DataFrame(),
        requests=pd.DataFrame(),
        capacity={},
        failures=[],
        after_soak=after,
        arrival_phases=before,
    )
    t = after_soak_table([run]).set_index("load")
    assert list(t.index) == ["1rps", "8rps"]  # one row per rate, not one for their shared max_in_flight
    assert t.loc["8rps", "before_achieved_rps"] == 2.0 and t.loc["8rps", "after_achieved_rps"] == 1.5
    assert (
        t.loc["8rps", "before_late"] == 20
        and t.loc["8rps", "after_late"] == 30
        and t.loc["1rps", "after_goodput_rps"] == 0.9
    )
    assert t.loc["8rps", "after_total_tps"] == 70.0


def test_the_soak_table_pools_the_windows_rates(tmp_path: Path) -> None:
    import pandas as pd

    from harness.report.load import RunData
    from harness.report.tables.soak import soak_table

    def win(t: float, secs: float, achieved: float, goodput: float, scheduled: int, late: int) -> dict[str, object]:
        return {
            "config": "base",
            "t_start_unix": t,
            "t_end_unix": t + secs,
            "achieved_rps": achieved,
            "goodput_rps": goodput,
            "scheduled": scheduled,
            "soak_t_start_s": t - 100,
            "soak_t_end_s": t - 100 + secs,
            "late": late,
        }

    windows = [win(100.0, 10.0, 1.0, 1.0, 20, 0), win(110.0, 30.0, 2.0, 0.5, 100, 9)]
    run = RunData(
        run_dir=tmp_path,
        manifest=Manifest(run_id="r"),
        phases=pd.DataFrame(),
        requests=pd.DataFrame(),
        capacity={},
        failures=[],
        soak_windows=windows,
        soak_slices=[{"event": "start", "slice": "s1", "config": "base", "t_unix": 100.0}],
    )
    row = soak_table([run]).iloc[0]
    assert row["achieved_rps"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40) and row["goodput_rps"] == pytest.approx(
        (10 + 15) / 40
    )
    assert row["offered_rps"] == pytest.approx(120 / 40) and row["late"] == 9
