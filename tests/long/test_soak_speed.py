"""Issue #33's first case, on the real llama-server: an open-loop Poisson soak in two stages, the engine slowed to half
its speed (SIGSTOP for half of every 0.2 s) once three windows of the busier stage were judged. Before the speed index the
detector judged no window of that soak: warm-up, building reference, then "load level changed" and "load settling" to the end,
since the slowed engine's queue never settles. Now the windows of the busier stage are judged whatever their backlog
does, and the slowdown is a ``collapse`` of ``speed_index`` within 5 minutes of the plant, none before it, and one of
``prefill_index`` (the first tokens' service, TTFT less the wait for a slot) within 5 minutes too.

``make live-checks`` runs it (about 6 minutes, alone on the machine); its run's records, trimmed by ``python -m
bench.soak_fixture RUN speed_planted``, are replayed by ``make test`` (tests/unit/test_speed.py; the 2026-12-08 run
with prompt sizes, fixture ``prefill_planted``, by tests/unit/test_prefill.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.records.files import VERDICTS, WINDOWS, read_jsonl
from harness.soak.coverage import coverage
from tests.long.test_soak_alone import WINDOW_S, open_loop_scenario, planted_soak

pytestmark = pytest.mark.engine

LIGHT_S = 120.0  # the light stage; then the busier one to the end
BUSY_WINDOWS_BEFORE_PLANT = 3  # judged windows of the busier stage before the plant (as the soak: 3 min in)
SOAK_S = 720.0  # an upper bound: the test stops the run once the collapse is in
WITHIN_S = 300.0  # the bound: a collapse within 5 minutes of the plant


def _scenario(folder: Path) -> Path:
    # 0.2 rps, then 1.2 rps of short prompts with 32-token answers on four slots: the busier stage keeps two to four
    # requests in flight at full speed, and at half speed its queue grows; every verdict is recorded and the soak runs
    # on, so the test reads which series moved, and when
    arrival = {
        "kind": "poisson",
        "max_in_flight": 4,
        "seed": 5,
        "stages": [{"rate_rps": 0.2, "duration_s": LIGHT_S}, {"rate_rps": 1.2, "duration_s": SOAK_S}],
    }
    return open_loop_scenario(folder, "speed", SOAK_S, arrival, 32, 30, {"collapse": "record", "drift": "record"})


def test_a_slowdown_at_the_busier_level_is_a_collapse_of_the_speed_index_within_five_minutes(tmp_path: Path) -> None:
    with planted_soak(tmp_path, _scenario(tmp_path), "speed", stopped_s=0.1) as soak:
        run_dir, plant = soak.run_dir, soak.plant

        def busy_judged() -> list[dict[str, Any]]:
            return [
                w
                for w in read_jsonl(run_dir / WINDOWS)
                if w["judged"] and w.get("soak_t_start_s", 0) >= LIGHT_S and w.get("speed_index") is not None
            ]

        soak.plant_once(lambda: len(busy_judged()) >= BUSY_WINDOWS_BEFORE_PLANT, SOAK_S / 2, "busy windows")

        def collapsed() -> bool:
            metrics = {v.get("metric") for v in read_jsonl(run_dir / VERDICTS)}
            return {"speed_index", "prefill_index"} <= metrics

        soak.wait(collapsed, WITHIN_S + 2 * WINDOW_S, "a speed and a prefill index collapse")
        soak.interrupt()
    out = soak.out_file.read_text()
    assert plant.onset_unix is not None, out[-3000:]
    windows = list(read_jsonl(run_dir / WINDOWS))
    verdicts = list(read_jsonl(run_dir / VERDICTS))
    assert not [v for v in verdicts if v["t_unix"] < plant.onset_unix], verdicts
    speed = [v for v in verdicts if v["kind"] == "collapse" and v["metric"] == "speed_index"]
    assert speed, [(v["kind"], v["metric"]) for v in verdicts]
    ev = speed[0]["evidence"]
    assert ev["onset_unix"] >= plant.onset_unix - WINDOW_S and ev["t_unix"] <= plant.onset_unix + WITHIN_S, ev
    before = [w["speed_index"] for w in windows if w["t_end_unix"] <= plant.onset_unix and w.get("speed_index")]
    after = [w["speed_index"] for w in windows if w["t_start_unix"] >= plant.onset_unix and w.get("speed_index")]
    assert max(after) < 0.75 * min(before[-BUSY_WINDOWS_BEFORE_PLANT:]), (before, after)
    # the first tokens too: their service (TTFT less the wait for a slot) against the engine's prefill model, judged
    # while the queue the slowed engine builds multiplies TTFT (harness/soak/prefill.py)
    prefill = [v for v in verdicts if v["kind"] == "collapse" and v["metric"] == "prefill_index"]
    assert prefill, [(v["kind"], v["metric"]) for v in verdicts]
    ev = prefill[0]["evidence"]
    assert ev["onset_unix"] >= plant.onset_unix - WINDOW_S and ev["t_unix"] <= plant.onset_unix + WITHIN_S, ev
    before = [w["prefill_index"] for w in windows if w["t_end_unix"] <= plant.onset_unix and w.get("prefill_index")]
    assert before and min(before) > 0.6, before
    # every window after the plant was judged, whatever its backlog did
    busy = coverage([w for w in windows if w["t_start_unix"] >= plant.onset_unix])
    assert busy.judged == busy.windows, busy.sentence("baseline")
