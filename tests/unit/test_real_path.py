"""Issue #33's rules on the path the live soak runs (bench/real_path.py): an engine learned from a real two-hour soak's
records, simulated request by request under the soak's own arrival code, each window built and judged as the slice
builds and judges it (window assembly, change detector, the watchdog's ``judge``). Unplanted, in the issue's four shapes:
no verdict but ``overload`` where the offered rate exceeds what the engine serves, and nearly every window after the
warm-up judged at every level; planted (the engine's speed halved) where the load moves: a ``collapse`` within five
minutes, nothing before it."""

from __future__ import annotations

import pytest

from bench.real_path import Engine, learned_engine, plants, run_row, shapes

SECONDS = 40 * 60.0


@pytest.fixture(scope="module")
def engine() -> Engine:
    return learned_engine()


def test_the_engine_is_learned_from_the_real_soak(engine: Engine) -> None:
    # llama-server on this 2-core CPU: one stream's decode in the tens of t/s, a total rate that barely grows with
    # streams, real requests' speeds spread around the curve
    assert 30.0 < engine.t1_tps < 200.0 and engine.beta <= 0.3, engine.source
    assert 0.1 < engine.capacity_rps() < 1.0 and len(engine.prefill_s) >= 20, engine.source
    assert 0.7 < float(engine.speed.mean()) < 1.3, engine.source


@pytest.mark.parametrize("shape", ["staged", "diurnal", "steady", "ramp"])
def test_an_unplanted_soak_gives_no_false_verdict_and_judges_nearly_every_window(engine: Engine, shape: str) -> None:
    load = next(ld for ld in shapes(engine.capacity_rps(), SECONDS).values() if ld.name == shape)
    row = run_row(engine, load, SECONDS, [0], None)
    assert row.false_verdicts == [], row
    # from the first window after the warm-up: the speed index is judged against its prior (1) until its reference
    # is built, on the curve the measurement phases began (86% and 0-86% at the worst level before, 2026-12-07)
    assert row.judged_share[0] >= 0.95 and row.worst_level_share[0] >= 0.9, row


@pytest.mark.parametrize(
    ("shape", "where"),
    [("staged", "light level"), ("staged", "across a level change"), ("diurnal", "diurnal peak"), ("ramp", "mid-ramp")],
)
def test_a_halved_engine_where_the_load_moves_is_a_collapse_within_five_minutes(
    engine: Engine, shape: str, where: str
) -> None:
    load = next(ld for ld in shapes(engine.capacity_rps(), SECONDS).values() if ld.name == shape)
    plant = next(p for p in plants(SECONDS)[shape] if p.where == where)
    row = run_row(engine, load, SECONDS, [0], plant)
    assert row.false_verdicts == [] and row.missed == 0, row
    assert row.delays_min[0] <= 5.0, row


@pytest.mark.parametrize(
    ("shape", "where", "seed"),
    # the seeds that took longest before the rule's gate fell to 20% and a slowdown's own windows stopped refining the
    # reference (before, 2026-12-07: staged seed 3 missed, diurnal seed 4 took 17 min, ramp seed 4 missed)
    [("staged", "busiest served level, 30%", 3), ("diurnal", "diurnal peak, 30%", 4), ("ramp", "mid-ramp, 30%", 4)],
)
def test_a_30_percent_slowdown_is_a_collapse_within_ten_minutes(
    engine: Engine, shape: str, where: str, seed: int
) -> None:
    load = next(ld for ld in shapes(engine.capacity_rps(), SECONDS).values() if ld.name == shape)
    plant = next(p for p in plants(SECONDS)[shape] if p.where == where)
    row = run_row(engine, load, SECONDS, [seed], plant)
    assert not [v for v in row.false_verdicts if "speed_index" in v] and row.missed == 0, row
    assert row.delays_min[0] <= 10.0, row


def test_two_sparse_windows_of_a_night_trough_are_no_collapse(engine: Engine) -> None:
    # diurnal seed 4: a 5-request window at 0.73, then one of two requests that disagreed at 0.56, against a reference
    # of 1.11; a collapse of the speed index until a window's own sd was widened for its few requests (Student's t)
    load = next(ld for ld in shapes(engine.capacity_rps(), SECONDS).values() if ld.name == "diurnal")
    assert run_row(engine, load, SECONDS, [4], None).false_verdicts == []
