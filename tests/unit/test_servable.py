"""Servable context, the SLO test and the max-streams ramp: the runner and the report share them."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from harness.detect.servable import search_max_streams, servable_context, slo_verdict
from harness.report.build import build_report

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"
CAP = {
    "slots": 4,
    "ctx_total": 8192,
    "kv_unified": False,
    "target": {"model_mib": 92.1, "kv_mib": 180.0, "compute_mib": 16.64},
    "draft": None,
}


def test_servable_context_is_budget_minus_fixed_over_kv_per_token() -> None:
    sv = servable_context(CAP, 512)
    assert sv is not None and sv.kv_kib_per_token == pytest.approx(22.5)
    assert sv.fixed_mib == pytest.approx(92.1 + 16.64)
    assert sv.ctx_total == math.floor((512 - 92.1 - 16.64) * 1024 / 22.5)
    assert sv.ctx_per_slot == sv.ctx_total // 4
    drafted = servable_context({**CAP, "draft": dict(CAP["target"])}, 512)
    assert drafted is not None and drafted.kv_kib_per_token == pytest.approx(45.0)
    assert drafted.ctx_total == math.floor((512 - 2 * (92.1 + 16.64)) * 1024 / 45.0)
    # a unified KV cache: one request may use all of it
    unified = servable_context({**CAP, "kv_unified": True}, 512)
    assert unified is not None and unified.ctx_per_slot == unified.ctx_total
    # a budget below the fixed cost serves nothing, never a negative context
    assert servable_context(CAP, 50).ctx_total == 0  # type: ignore[union-attr]  # a capacity given: not None
    assert servable_context(CAP, None).ctx_total is None  # type: ignore[union-attr]  # a capacity given: not None
    assert servable_context({"slots": 4, "target": {}}, 512) is None


def test_slo_verdict_counts_failures_and_both_limits() -> None:
    ok = [("ok", 20.0, 0.5), ("ok", 30.0, 0.7), ("ok", 25.0, 0.6)]
    v = slo_verdict(ok, 20.0, 1.0)
    assert v.passed and v.per_stream_tps == 25.0 and v.ttft_p95_s == pytest.approx(0.69)
    assert not slo_verdict(ok, 26.0, None).passed
    assert "TTFT p95 0.69 s > 0.6 s" in slo_verdict(ok, None, 0.6).why
    failed = slo_verdict([*ok, ("error", None, None)], None, None)
    assert not failed.passed and failed.failed == 1 and failed.why == "1 failed request(s)"
    assert "✗" in failed.evidence(3) and "1 failed" in failed.evidence(3)
    assert slo_verdict([], None, None).passed  # nothing asked, nothing failed


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 7, 8, 13, 31, 64, 100])
def test_ramp_finds_the_limit_with_each_n_tried_once(limit: int) -> None:
    tried: list[int] = []

    def passes(n: int) -> bool:
        tried.append(n)
        return n <= limit

    good, bad = search_max_streams(passes, 1, 64)
    assert len(tried) == len(set(tried))
    if limit >= 64:
        assert (good, bad) == (64, None) and tried == [1, 2, 4, 8, 16, 32, 64]
    else:
        assert (good, bad) == (limit, limit + 1)
        assert len(tried) <= 2 * math.ceil(math.log2(64)) + 1


def test_ramp_from_a_later_start_and_a_max_that_is_not_a_power_of_two() -> None:
    tried: list[int] = []
    assert search_max_streams(lambda n: tried.append(n) or True, 3, 10) == (10, None)
    assert tried == [3, 6, 10]
    tried.clear()
    # the first N already fails: bisect below it (start is a hint, not a floor)
    assert search_max_streams(lambda n: tried.append(n) or False, 4, 10) == (0, 1)
    assert tried == [4, 2, 1]


def _ramp_run(tmp_path: Path) -> Path:
    """The quick fixture run plus a ramp for draft-self-k3 (1, 2, 4, 8 then 6, 5) and fill checks."""
    d = tmp_path / "20261129T102500Z-quick"
    shutil.copytree(FIXTURE, d)
    m = json.loads((d / "manifest.json").read_text())
    m["scenario_parsed"]["slo"] = {"per_stream_tps_min": 10, "ramp": {"start": 1, "max_streams": 8}}
    m["scenario_parsed"]["report"] = {"memory_budget_mib": 512, "fill_check": True}
    (d / "manifest.json").write_text(json.dumps(m))
    tps = {1: 30.0, 2: 20.0, 4: 12.0, 8: 6.0, 6: 9.0, 5: 10.5}
    steps, reqs = [], []
    for i, (n, v) in enumerate(tps.items()):
        att = f"draft-self-k3/ramp/{n}/{i + 1}/x"
        steps.append({"event": "step", "config": "draft-self-k3", "streams": n, "attempt": att, "passed": v >= 10})
        reqs += [
            {
                "config": "draft-self-k3",
                "phase": "ramp",
                "streams": n,
                "repetition": i + 1,
                "start_unix_s": 1.8e9 + i,
                "attempt": att,
                "status": "ok",
                "decode_tps": v,
                "ttft_s": 0.5,
            }
            for _ in range(n)
        ]
    steps.append({"event": "result", "config": "draft-self-k3", "max_streams": 5, "first_failing": 6})
    (d / "ramp.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    with (d / "requests.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in reqs))
    fills = [
        {
            "config": "baseline",
            "budget_mib": 512.0,
            "status": "ok",
            "started_ctx_total": 17408,
            "engine_ctx_per_slot": 4352,
            "min_tokens_filled": 4340,
            "log_total_mib": 490.0,
            "rss_peak_mib": 530.0,
            "overflow_refused": True,
            "detail": "4/4 slots filled",
        },
        {
            "config": "draft-self-k3",
            "budget_mib": 512.0,
            "status": "failed",
            "started_ctx_total": 6656,
            "engine_ctx_per_slot": 1664,
            "min_tokens_filled": 1650,
            "overflow_refused": False,
            "detail": "a prompt past the context was NOT refused",
        },
    ]
    (d / "fill_checks.jsonl").write_text("".join(json.dumps(f) + "\n" for f in fills))
    return d


def test_report_uses_the_ramp_and_shows_the_fill_check(tmp_path: Path) -> None:
    rep = build_report([_ramp_run(tmp_path)])
    ms = rep.tables["max_streams"].set_index("config")
    d = ms.loc["draft-self-k3"]
    assert d["max_streams_source"] == "adaptive ramp" and d["max_streams"] == 5 and not d["max_streams_is_lower_bound"]
    assert d["first_failing"].startswith("N=6: per-stream 9.0 t/s < 10")
    assert d["evidence"].split("; ")[0].startswith("N=1: 30.0") and d["largest_measured_streams"] == 8
    # no ramp records for the baseline: its measured stream counts decide
    assert (
        ms.loc["baseline", "max_streams_source"] == "measured stream counts" and ms.loc["baseline", "max_streams"] == 4
    )
    mem = rep.tables["memory"].set_index("config")
    assert mem.loc["baseline", "fill_check"] == "ok" and mem.loc["baseline", "fill_rss_peak_mib"] == 530.0
    assert mem.loc["draft-self-k3", "fill_check"] == "failed" and not mem.loc["draft-self-k3", "fill_overflow_refused"]
    shown = rep.display.set_index("configuration")["servable ctx/slot (budget)"]
    assert shown["baseline"].endswith("✓") and shown["draft-self-k3"].endswith("✗")
    md = rep.markdown.read_text()
    assert (
        "Adaptive ramp (the scenario's `slo.ramp`)" in md
        and re.search(r"\| draft-self-k3 +\| 5 +\| +4 \| adaptive ramp", md)
        and "Checked: each configuration was started again" in md
    )
    # a fill check made under another budget is not shown as if it were this one's
    other = build_report([_ramp_run(tmp_path / "b")], memory_budget_mib=1024).tables["memory"]
    assert (other["fill_check"] == "not run").all()
