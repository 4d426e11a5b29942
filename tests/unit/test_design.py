"""The interleaved design's order and prompts, paired ratio intervals, the control and `specsoak compare`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.stats import ratio_interval, shown_difference
from harness.report.build import build_report
from harness.report.design import compare_summary, compare_table
from harness.report.load import load_run
from harness.report.verdict import verdict_table
from harness.run.order import block_order, prompt_offset

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"


def test_block_order_is_a_seeded_shuffle_that_differs_between_blocks() -> None:
    names = [f"c{i}" for i in range(6)]
    orders = [block_order(names, 7, b) for b in range(1, 6)]
    assert all(sorted(o) == names for o in orders)
    assert orders == [block_order(names, 7, b) for b in range(1, 6)]  # a resumed run replays the same order
    assert len({tuple(o) for o in orders}) > 1
    assert orders != [block_order(names, 8, b) for b in range(1, 6)]


def test_prompt_offsets_give_each_phase_its_own_prompts_in_either_design() -> None:
    streams, reps, rps = [1, 4], 3, 2
    seen: list[int] = []
    for n in streams:
        for r in range(1, reps + 1):
            off = prompt_offset(rps, streams, reps, n, r)
            seen.extend(range(off, off + n * rps))
    assert seen == list(range(len(seen)))  # consecutive, no overlap: what the sequential runner always sent
    with pytest.raises(ValueError, match="no phase with 2 streams and repetition 1"):
        prompt_offset(rps, streams, reps, 2, 1)


def test_ratio_interval_is_the_geometric_mean_inside_its_own_log_interval() -> None:
    centre, lo, hi = ratio_interval([0.5, 2.0])
    assert centre == pytest.approx(1.0)
    assert lo is not None and hi is not None and lo * hi == pytest.approx(1.0)  # symmetric in the log
    centre, lo, hi = ratio_interval([0.9, 0.92, 0.88, 0.91])
    assert lo < centre < hi < 1.0
    assert ratio_interval([1.3]) == (pytest.approx(1.3), None, None)
    assert ratio_interval([]) == (None, None, None)


def test_a_ratio_whose_interval_straddles_one_is_no_difference() -> None:
    assert shown_difference(0.9, 1.1) == "no difference shown"
    assert shown_difference(1.01, 1.2) == "faster"
    assert shown_difference(0.5, 0.99) == "slower"
    assert shown_difference(None, 1.2) is None


def test_the_report_never_calls_a_straddling_ratio_a_win(tmp_path: Path) -> None:
    rep = build_report([_copy(tmp_path, "a")])
    v = rep.verdict.set_index("config")
    assert (
        v.loc["ngram-map-k", "speedup_4_ci_low"] < 1.0 < v.loc["ngram-map-k", "speedup_4_ci_high"]
    )  # the real run: 1.00× [0.86, 1.17]
    shown = rep.display.set_index("configuration")
    assert shown.loc["ngram-map-k", "@4 vs baseline [95% CI]"].endswith("no difference shown")
    assert "no difference" not in shown.loc["draft-self-k3", "@4 vs baseline [95% CI]"]
    assert shown.loc["baseline", "@4 vs baseline [95% CI]"] == "(baseline)"
    be = rep.tables["break_even"].set_index("config")
    assert be.loc["ngram-map-k", "shown_by_intervals"] == "N=1: no difference shown, N=4: no difference shown"
    assert be.loc["draft-self-k3", "shown_by_intervals"] == "N=1: slower, N=4: slower"


def _copy(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(RUN, d)
    return d


def test_report_states_the_design_and_flags_a_drifting_control(tmp_path: Path) -> None:
    d = _copy(tmp_path, "a")
    m = json.loads((d / "manifest.json").read_text())
    m["scenario_parsed"]["measurement"]["control_drift_max"] = 0.15  # the scenario's bound, not the default, is applied
    (d / "manifest.json").write_text(json.dumps(m))
    rep = build_report([d])
    md = rep.markdown.read_text()
    assert (
        "**sequential**" in md
    )  # recorded before designs existed: all repetitions of one configuration, then the next
    cs = rep.tables["control_summary"].iloc[0]
    # the real quick run's baseline: 58.6 … 71.7 solo t/s over its three repetitions, a 20% spread
    assert cs["control_spread"] == pytest.approx(
        (cs["control_max_tps"] - cs["control_min_tps"]) / cs["control_median_tps"]
    )
    assert cs["drifted"] and "The machine's speed drifted" in md
    assert (d / "control.png").is_file()
    m = json.loads((d / "manifest.json").read_text())
    m["scenario_parsed"]["measurement"]["control_drift_max"] = 0.5
    m["design"] = {
        "kind": "interleaved",
        "order_seed": 11,
        "blocks": [{"repetition": 1, "order": ["ngram-map-k", "baseline", "draft-self-k3"]}],
    }
    (d / "manifest.json").write_text(json.dumps(m))
    rep = build_report([d])
    md = rep.markdown.read_text()
    assert not rep.tables["control_summary"].iloc[0]["drifted"] and "drifted" not in md.split("## Notes")[-1]
    assert "**interleaved**, 3 blocks, order seed 11" in md and "block 1: ngram-map-k, baseline, draft-self-k3" in md


def test_compare_agrees_with_itself_and_catches_a_run_outside_the_interval(tmp_path: Path) -> None:
    a = verdict_table([load_run(RUN)])
    same = compare_table(a, a)
    assert set(same["config"]) == {"ngram-map-k", "draft-self-k3"}  # the baseline against itself is not a figure
    assert compare_summary(same)["disagree"] == 0 and compare_summary(same)["median_abs_difference"] == 0
    b = a.copy()
    b.loc[b["config"] == "draft-self-k3", ["speedup_4", "speedup_4_ci_low", "speedup_4_ci_high"]] = [0.80, 0.75, 0.85]
    cmp = compare_table(a, b)
    row = cmp[(cmp["config"] == "draft-self-k3") & (cmp["figure"] == "@4 vs baseline")].iloc[0]
    assert row["agree"] is False or row["agree"] == False  # noqa: E712  numpy.False_ is not False
    assert row["difference"] == pytest.approx(0.80 / a.set_index("config").loc["draft-self-k3", "speedup_4"] - 1)
    assert compare_summary(cmp)["disagree"] == 1


def test_cli_compare_exit_codes(tmp_path: Path) -> None:
    a, b = _copy(tmp_path, "a"), _copy(tmp_path, "b")
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", str(a), str(b), "--out", str(tmp_path / "cmp")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "6 of 6 ratios agree" in p.stdout and (tmp_path / "cmp" / "compare.md").is_file()
    # run B's draft-self-k3 twice as fast at 4 streams: outside run A's interval, and A outside B's
    rows = [json.loads(x) for x in (b / "phases.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        if r["config"] == "draft-self-k3" and r["streams"] == 4:
            r["total_tps"] *= 2
    (b / "phases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 1 and "5 of 6 ratios agree" in p.stdout, p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", str(a), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2 and "not a run folder" in p.stderr
