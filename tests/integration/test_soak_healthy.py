"""The gauntlet's soak (tests/integration/test_soak_gauntlet.py) with nothing planted, every action as a user gets it:
no verdict at all, on this machine's speed (the baseline) and on an engine at half of it (the speculative
configuration, frozen for half of every 0.2 s from its start: a machine half as fast), and the speculative
configuration's canary answers equal its first ones and the baseline's (the floor measured in docs/soak.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.common.net import free_port
from harness.records.files import AFTER_SOAK, VERDICTS, WINDOWS, read_jsonl
from harness.soak.canary import CANARY
from tests.faults.proxy import FaultProxy
from tests.integration.conftest import SMOLLM2
from tests.integration.plants import DutyCyclePlant
from tests.integration.test_soak_gauntlet import WINDOW_S, scenario, start_run

pytestmark = pytest.mark.engine

SOAK_S = 100.0
SLOW = "self-draft"  # the configuration whose engine runs at half speed


def test_the_same_soak_without_a_plant_gives_no_verdict_at_full_and_at_half_speed(tmp_path: Path) -> None:
    engine_port = free_port()
    results = tmp_path / "results"
    with FaultProxy(f"http://127.0.0.1:{engine_port}") as proxy:
        configs = [
            {"name": "baseline", "algorithm": "none"},
            {"name": SLOW, "algorithm": "draft-simple", "draft": SMOLLM2, "k": 2},
        ]
        path = scenario(tmp_path, "healthy", engine_port, proxy.url, configs, soak_s=SOAK_S)
        proc, out = start_run(path, results)
        slow = DutyCyclePlant(proc.pid, speed=0.5, plant=False, config=SLOW)
        slow.start()
        try:
            rc = proc.wait(timeout=540)  # under the suite's 600-s test timeout, so this message is the one given
        finally:
            slow.done.set()
            slow.join(10)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    text = out.read_text()
    assert rc == 0, text[-3000:]
    assert slow.engine_started_unix is not None, "the half-speed engine was never found"
    assert proxy.corrupted == 0
    run_dir = next(results.glob("*-healthy"))
    assert list(read_jsonl(run_dir / VERDICTS)) == []
    windows = list(read_jsonl(run_dir / WINDOWS))
    for config in ("baseline", SLOW):
        mine = [w for w in windows if w["config"] == config]
        assert len(mine) >= SOAK_S / WINDOW_S - 1, (config, len(mine))
        judged = [w for w in mine if w["judged"]]
        assert len(judged) >= 5, (config, [(w.get("not_judged_why"), w.get("contaminated")) for w in mine])
        # the silence beside what was looked at: the console says how many windows were judged, and why not the rest
        assert f"soak windows judged: {config}: {len(judged)}/{len(mine)} (" in text, text[-3000:]
        # one engine process lived through the whole soak
        assert len({w["engine_pid"] for w in mine}) == 1
        assert mine[-1]["engine_uptime_s"] >= SOAK_S - WINDOW_S
    after = list(read_jsonl(run_dir / AFTER_SOAK))
    assert {p["config"] for p in after} == {"baseline", SLOW}
    assert all(p["phase"] == "after_soak" and p["engine_uptime_s"] >= SOAK_S for p in after)
    # the output canary: every answer given, the speculative ones equal to their first and to the baseline's
    answers = list(read_jsonl(run_dir / CANARY))
    assert all(a["status"] == "ok" and a["tokens"] for a in answers)
    for config in ("baseline", SLOW):
        assert len({a["round"] for a in answers if a["config"] == config}) >= 2, config
    spec = [a for a in answers if a["config"] == SLOW]
    assert all(a["vs_first"]["identical"] for a in spec if a.get("vs_first")), spec
    assert [a for a in spec if a.get("vs_baseline")] and all(
        a["vs_baseline"]["identical"] for a in spec if a.get("vs_baseline")
    )
