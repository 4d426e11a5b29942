"""Issue #33's planted slowdowns where users meet them, on the real llama-server: across a level change, at the peak of
a bursty diurnal curve, in a closed-loop ramp (50% each: SIGSTOP for half of every 0.2 s), and a 30% slowdown at the
busier level. The load moves in each, so no window there is "settled": only the speed index (docs/detector.md#speed-index)
judges them. Each must be a ``collapse`` within 5 minutes of the plant (10 for the 30%), and no verdict before it.

``make live-checks`` runs them (4-6 minutes each, alone on the machine); the figures are in docs/soak.md#planted-slowdowns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.records.files import SLICES, VERDICTS, WINDOWS, read_jsonl
from harness.soak.coverage import coverage
from tests.integration.test_soak_watch import _write
from tests.long.test_soak_alone import WINDOW_S, open_loop_scenario, planted_soak

pytestmark = pytest.mark.engine

SOAK_S = 900.0  # an upper bound: each test stops the run once the collapse is in
ACTIONS = {"collapse": "record", "drift": "record"}  # planted, not healthy: the run goes on so the test reads when


@dataclass(frozen=True)
class Plant:
    name: str
    at_s: float  # the plant's start, in seconds of soak
    stopped_s: float  # of every 0.2 s
    within_s: float  # the collapse's deadline after the plant
    why: str


def _open_loop(folder: Path, name: str, arrival: dict[str, Any]) -> Path:
    return open_loop_scenario(folder, name, SOAK_S, arrival, 32, 30, ACTIONS)


def _ramp(folder: Path, name: str) -> Path:
    """Closed loop: 1 -> 4 users over the soak, short prompts, 32-token answers; the same windows as the open-loop
    plants."""
    sc = open_loop_scenario(folder, name, SOAK_S, {"kind": "poisson", "rate_rps": 1.0}, 32, 30, ACTIONS)
    data = yaml.safe_load(sc.read_text())
    del data["soak"]["arrival"]
    data["soak"]["shape"] = {"kind": "ramp", "start_users": 1, "users": 4}
    return _write(folder, data)


LEVEL_CHANGE = {"kind": "poisson", "max_in_flight": 4, "seed": 5}
CASES = {
    # 0.2 rps, then 1.2 rps; planted as the busier stage begins: every window after it is a level change or unsettled
    "level-change": (
        Plant("level-change", 200.0, 0.1, 300.0, "across a level change"),
        lambda f: _open_loop(
            f,
            "level-change",
            {
                **LEVEL_CHANGE,
                "stages": [{"rate_rps": 0.2, "duration_s": 200.0}, {"rate_rps": 1.2, "duration_s": SOAK_S}],
            },
        ),
    ),
    # gamma arrivals (cv 2) on a compressed day: 0.1 rps at midnight, 1.2 at noon (300 s); planted at noon
    "diurnal-peak": (
        Plant("diurnal-peak", 300.0, 0.1, 300.0, "at the peak of a bursty diurnal curve"),
        lambda f: _open_loop(
            f,
            "diurnal-peak",
            {
                "kind": "gamma",
                "cv": 2.0,
                "curve": "diurnal",
                "rate_rps": 1.2,
                "trough_rps": 0.1,
                "period_s": 600.0,
                "max_in_flight": 4,
                "seed": 5,
            },
        ),
    ),
    # closed loop, 1 -> 4 users over 900 s: planted at 2 users and rising
    "closed-loop-ramp": (
        Plant("closed-loop-ramp", 300.0, 0.1, 300.0, "in a closed-loop ramp"),
        lambda f: _ramp(f, "closed-loop-ramp"),
    ),
    # 30%: the engine frozen for 0.06 of every 0.2 s at the busier stage, three minutes into it
    "thirty-percent": (
        Plant("thirty-percent", 320.0, 0.06, 600.0, "a 30% slowdown at the busier level"),
        lambda f: _open_loop(
            f,
            "thirty-percent",
            {
                **LEVEL_CHANGE,
                "stages": [{"rate_rps": 0.2, "duration_s": 140.0}, {"rate_rps": 1.2, "duration_s": SOAK_S}],
            },
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_planted_slowdown_where_the_load_moves_is_a_collapse_in_time_and_nothing_before(
    tmp_path: Path, case: str
) -> None:
    plant_spec, make = CASES[case]
    with planted_soak(tmp_path, make(tmp_path), plant_spec.name, stopped_s=plant_spec.stopped_s) as soak:
        run_dir, plant = soak.run_dir, soak.plant

        def soak_start() -> float | None:
            return next((e["t_unix"] for e in read_jsonl(run_dir / SLICES) if e["event"] == "start"), None)

        t0 = soak.wait(soak_start, 240, "the soak's start")
        soak.plant_once(lambda: time.time() >= t0 + plant_spec.at_s, plant_spec.at_s + 60, "the plant's time")

        def collapsed() -> bool:
            return any(v["kind"] == "collapse" for v in read_jsonl(run_dir / VERDICTS))

        soak.wait(collapsed, plant_spec.within_s + 2 * WINDOW_S, f"a collapse {plant_spec.why}")
        soak.interrupt()
    out = soak.out_file.read_text()
    assert plant.onset_unix is not None, out[-3000:]
    windows = list(read_jsonl(run_dir / WINDOWS))
    verdicts = list(read_jsonl(run_dir / VERDICTS))
    # nothing before the plant but an overload (the offered rate past what the engine serves: a finding)
    assert not [v for v in verdicts if v["t_unix"] < plant.onset_unix and v["kind"] != "overload"], verdicts
    first = next(v for v in verdicts if v["kind"] == "collapse")
    assert first["t_unix"] <= plant.onset_unix + plant_spec.within_s, first
    before = [w for w in windows if w["t_end_unix"] <= plant.onset_unix]
    after = [w for w in windows if w["t_start_unix"] >= plant.onset_unix and w["t_unix"] <= first["t_unix"]]
    print(
        f"{case}: {first['kind']} of {first['metric']} {first['evidence'].get('relative_change')} "
        f"{first['t_unix'] - plant.onset_unix:.0f} s after the plant; index before "
        f"{[round(w['speed_index'], 2) for w in before if w.get('speed_index')]}, after "
        f"{[round(w['speed_index'], 2) for w in after if w.get('speed_index')]}; "
        f"judged before {coverage(before).cell()}, after {coverage(after).cell()}"
    )
    # the windows where the load moved were judged: all those after the plant up to the verdict
    assert coverage(after).judged == coverage(after).windows, coverage(after).sentence(case)
