"""A soak's coverage (harness/soak/coverage.py): of the windows with traffic, how many the change detector judged, per
metric and per load level, and why not, read from the records of real soaks."""

from __future__ import annotations

import json
from typing import Any

from harness.report.verdict import soak_verdict
from harness.soak.coverage import coverage
from tests.conftest import FIXTURES

RECORDS = FIXTURES / "soak_records"


def _windows(name: str, config: str) -> list[dict[str, Any]]:
    lines = (RECORDS / name / "windows.jsonl").read_text().splitlines()
    return [w for w in map(json.loads, lines) if w["config"] == config]


def test_the_third_two_hour_soak_judged_half_its_windows_and_says_why_not_the_others() -> None:
    # fixture alone3_2h (scenarios/soak-2h-cpu.yaml, open loop in three stages): 30 and 25 of 60 windows judged
    base, ngram = coverage(_windows("alone3_2h", "baseline")), coverage(_windows("alone3_2h", "ngram-map-k"))
    assert (base.judged, base.windows, ngram.judged, ngram.windows) == (30, 60, 25, 60)
    assert base.cell() == "30/60 (50%)" and base.share == 0.5
    assert sum(base.not_judged.values()) == 30 and next(iter(base.not_judged)) == "load settling"
    assert base.not_judged["contaminated"] == 3 and ngram.not_judged["contaminated"] == 10
    # by load level, named by rate: the busiest stage the least judged
    assert base.by_level["~0.239 rps"] == (2, 13) and sum(n for _, n in base.by_level.values()) == 60
    # open loop: per-request decode t/s is not a metric of this loop; the decode of requests that ran alone is
    assert "decode_tps" not in base.by_metric and base.by_metric["alone_decode_tps"] == (26, 40)
    assert "acceptance" not in base.by_metric and ngram.by_metric["acceptance"] == (14, 59)
    text = base.sentence("baseline")
    assert text.startswith("baseline: 30/60 (50%) of its windows with traffic judged; by load ~0.149 rps 19/30")
    assert text.endswith(
        "not judged: load settling 15, building reference 7, warm-up 3, contaminated 3, load level changed 2"
    )


def test_a_closed_loop_soak_is_judged_by_users_and_a_window_without_traffic_is_not_counted() -> None:
    wins = _windows("gauntlet", "self-draft")
    cov = coverage(wins)
    assert cov.by_level == {"1 user": (cov.judged, cov.windows)} and cov.not_judged == {
        "building reference": 3,
        "warm-up": 1,
    }
    # the planted collapse's last windows served nothing to the one user: they count, judged
    frozen = [w for w in wins if w["output_tps"] == 0.0]
    assert frozen and all(w["users"] == 1 and w["judged"] for w in frozen) and cov.windows == len(wins)
    idle = {**wins[0], "users": 0, "requests": 0, "streaming_requests": 0, "output_tps": 0.0, "judged": False}
    assert coverage([*wins, idle]).windows == cov.windows
    assert coverage([]).cell() == "–" and coverage([]).why() == "none"


def test_an_ok_soak_says_how_many_windows_were_judged() -> None:
    assert soak_verdict({"status": "ok", "soak_s": 7200, "windows": 60, "judged_windows": 30}) == (
        "ok (2.00 h, 30/60 windows judged)"
    )
    assert soak_verdict({"status": "ok", "soak_s": 7200}) == "ok (2.00 h)"  # a manifest from before it was counted
