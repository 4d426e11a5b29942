"""An open-loop soak at a rate the engine serves, then the engine slowed far under that rate: the queue grows and no
window settles again. The ``overload`` rule, judged on every window whatever its backlog, sees the engine sustain
much less than the rate it served earlier in this soak, and that is a ``collapse`` of ``served_rps`` with its default
action: the configuration stops, `specsoak run` exits 4 (docs/soak.md#overload, issue #33). (In the run the fixture
came from, the change detector also judged the slowed windows, their level having a reference, and gave its own
collapses in the same window; a level without a reference yet would have had only this rule.)

The plant (tests/integration/plants.py's duty cycle) waits for the soak's own records: two windows whose backlog
held still at the soak's one rate (the rate served). Then the engine is frozen for 95% of every 0.2 s (it decodes
at about a twentieth of its speed, well under 0.5 rps of 16-token answers). A `make live-checks` test (alone on the
machine, about five minutes); its records are the fixture ``overload_planted`` that `make test` replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records.files import VERDICTS, WINDOWS, read_jsonl
from tests.long.test_soak_alone import WINDOW_S, open_loop_scenario, planted_soak

pytestmark = pytest.mark.engine

RATE_RPS = 0.5
SETTLED_BEFORE_PLANT = 2
SOAK_S = 600.0  # an upper bound: the collapse stops the configuration
EXIT_SOAK = 4


def _scenario(folder: Path) -> Path:
    # short prompts and 16-token answers: a fraction of a second each at full speed, so 0.5 rps is served
    # (builtin:repeat's long prompts at 1 rps kept 8 in flight and every send late: the engine's capacity)
    arrival = {"kind": "poisson", "rate_rps": RATE_RPS, "max_in_flight": 8, "seed": 5}
    return open_loop_scenario(folder, "overload", SOAK_S, arrival, 16, 60, None)


def test_an_engine_slowed_under_the_rate_it_served_is_a_collapse_of_the_served_rate(tmp_path: Path) -> None:
    with planted_soak(tmp_path, _scenario(tmp_path), "overload", stopped_s=0.19) as soak:
        run_dir, plant, proc = soak.run_dir, soak.plant, soak.proc

        def settled() -> int:
            return sum(1 for w in read_jsonl(run_dir / WINDOWS) if w.get("load_settled"))

        soak.plant_once(lambda: settled() >= SETTLED_BEFORE_PLANT, SOAK_S / 2, "settled windows")
        proc.wait(12 * WINDOW_S)  # the collapse stops the configuration, and the run ends
    out = soak.out_file.read_text()
    assert plant.onset_unix is not None, out[-3000:]
    assert proc.returncode == EXIT_SOAK, out[-3000:]
    windows = list(read_jsonl(run_dir / WINDOWS))
    verdicts = list(read_jsonl(run_dir / VERDICTS))
    before = [w for w in windows if w["t_end_unix"] <= plant.onset_unix]
    after = [w for w in windows if w["t_start_unix"] >= plant.onset_unix]
    queues = [w.get("outstanding_end") for w in windows]
    assert not [v for v in verdicts if v["t_unix"] < plant.onset_unix], verdicts
    # before: the rate served, the backlog still; after: the queue grows and no window settles
    assert sum(bool(w.get("load_settled")) for w in before) >= SETTLED_BEFORE_PLANT, queues
    assert after and not any(w.get("load_settled") for w in after), queues
    served = [v for v in verdicts if v["kind"] == "collapse" and v["metric"] == "served_rps"]
    assert served, ([(v["kind"], v["metric"]) for v in verdicts], queues)
    ev = served[0]["evidence"]
    assert ev["onset_unix"] >= plant.onset_unix - WINDOW_S and ev["relative_change"] <= -0.25, ev
    assert served[0]["t_unix"] - plant.onset_unix <= 300, "within five minutes of the plant"
    assert served[0]["action"] == "stop_config"
    print(
        f"plant at {plant.onset_unix:.0f}; served collapse {served[0]['t_unix'] - plant.onset_unix:.0f} s later: "
        f"{served[0]['message']}; queues {queues}; judged {[w['judged'] for w in windows]}"
    )
