"""After the soak, a verdict (issue #33): the soaked engine's phases against the fresh engine's, with an interval.

Replayed through `specsoak report` on copies of a real run folder (tests/fixtures/run_soak_cache: llama-server, one
repetition before its soak and one after), whose after_soak.jsonl is given planted repetitions: the report's own path
from the records to after_soak.csv and the verdict table's soak cell."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from harness.common.stats import unpaired_ratio_interval
from harness.records.files import AFTER_SOAK

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_soak_cache"
CONFIG = "cache-fits"  # the fixture's configuration that ran its soak out and was measured again


BEFORE = (1.0, 0.97, 1.03)  # the fresh engine's repetitions: each side of the interval needs its own spread


def _report(
    tmp_path: Path, factors: list[float], before: tuple[float, ...] = BEFORE
) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The fixture's folder with its after-soak phase repeated, repetition i at ``factors[i]`` times its total t/s, and
    its measurement phase before the soak repeated at ``before[i]`` times its own."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    real = json.loads((run / AFTER_SOAK).read_text().splitlines()[0])
    assert real["config"] == CONFIG and real["phase"] == "after_soak"
    phases = [json.loads(line) for line in (run / "phases.jsonl").read_text().splitlines()]
    fresh = next(p for p in phases if p["config"] == CONFIG and p["streams"] == real["streams"])
    copies = [
        {
            **fresh,
            "repetition": fresh["repetition"] + i,
            "attempt": f"{fresh['attempt']}-b{i}",
            "total_tps": fresh["total_tps"] * f,
            "median_decode_tps": fresh["median_decode_tps"] * f,
        }
        for i, f in enumerate(before)
    ]
    phases = [c for p in phases for c in (copies if p is fresh else [p])]
    (run / "phases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in phases))
    planted = [
        {
            **real,
            "repetition": i,
            "attempt": f"{real['attempt']}-{i}",
            "total_tps": real["total_tps"] * f,
            "median_decode_tps": real["median_decode_tps"] * f,
        }
        for i, f in enumerate(factors, start=1)
    ]
    (run / AFTER_SOAK).write_text("".join(json.dumps(r) + "\n" for r in planted))
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    after = pd.read_csv(out / "after_soak.csv").set_index("config")
    verdict = pd.read_csv(out / "verdict.csv").set_index("config")
    return after, verdict, (out / "report.md").read_text()


def test_a_soaked_engine_at_half_its_fresh_speed_is_degraded_in_the_soak_column(tmp_path: Path) -> None:
    factors = [0.50, 0.47, 0.53]
    after, verdict, report = _report(tmp_path, factors)
    row = after.loc[CONFIG]
    assert row["before_reps"] == 3 and row["after_reps"] == 3
    # judged on the phases' median decode t/s (closed loop): the fixture's own figures, before and after its soak
    phases = [json.loads(line) for line in (FIXTURE / "phases.jsonl").read_text().splitlines()]
    before = next(p["median_decode_tps"] for p in phases if p["config"] == CONFIG)
    real = json.loads((FIXTURE / AFTER_SOAK).read_text().splitlines()[0])["median_decode_tps"]
    geo = lambda x, fs: math.exp(sum(math.log(x * f) for f in fs) / len(fs))
    assert row["ratio_metric"] == "median_decode_tps"
    assert row["ratio"] == pytest.approx(geo(real, factors) / geo(before, BEFORE))
    assert row["ratio_ci_high"] < 1.0 and row["verdict"] == "degraded", row.to_dict()
    cell = verdict.loc[CONFIG, "soak"]
    assert cell.startswith("ok (") and f"degraded after soak: {row['ratio']:.2f}×" in cell and "at 1 stream" in cell
    assert "degraded after soak" not in str(
        verdict.loc["cache-default", "soak"]
    )  # stopped by its verdict: not measured
    assert "degraded after soak" in report


def test_a_soaked_engine_within_its_noise_is_the_same_and_one_repetition_each_side_has_no_interval(
    tmp_path: Path,
) -> None:
    # the fixture's engine was 1.06x its fresh self after its soak: these factors bring it back around 1.0
    after, verdict, _ = _report(tmp_path / "same", [0.945, 0.915, 0.975])
    row = after.loc[CONFIG]
    assert row["ratio_ci_low"] < 1.0 < row["ratio_ci_high"] and row["verdict"] == "same within the interval"
    assert "degraded" not in verdict.loc[CONFIG, "soak"]

    after, verdict, _ = _report(
        tmp_path / "one", [0.5], before=(1.0,)
    )  # half speed, but one phase on each side: no interval
    row = after.loc[CONFIG]
    assert pd.isna(row["ratio_ci_low"]) and row["verdict"].startswith("n/a")
    assert "degraded" not in verdict.loc[CONFIG, "soak"]


def test_one_fresh_repetition_against_three_tight_ones_after_is_no_interval_not_degraded(tmp_path: Path) -> None:
    # the 30-minute ramp of 2026-12-07: a single repetition before has no spread of its own; three back-to-back ones
    # after agree within 1%, and a pooled interval lent them to it: 0.91x [0.87, 0.95], `degraded` on a healthy engine
    after, verdict, _ = _report(tmp_path, [0.91, 0.92, 0.915], before=(1.0,))
    row = after.loc[CONFIG]
    assert row["before_reps"] == 1 and pd.isna(row["ratio_ci_high"])
    assert row["verdict"] == "n/a (one repetition before (measurement.repetitions): no interval)"
    assert "degraded" not in verdict.loc[CONFIG, "soak"]


@pytest.mark.parametrize(
    ("before", "after"),
    [([10.0, 11.0, 9.5], [5.2, 4.9, 5.0, 5.4]), ([7.47, 7.1], [3.9, 3.7, 4.1]), ([80.0, 76.0], [79.0, 83.0])],
)
def test_the_after_over_before_interval_is_scipys_welch_two_sample_t_interval(
    before: list[float], after: list[float]
) -> None:
    """Against scipy's own two-sample t test (Welch's, unequal variances) on the logarithms, its confidence interval
    back-transformed: an independent computation of the same interval."""
    ratio, lo, hi = unpaired_ratio_interval(before, after)
    res = stats.ttest_ind([math.log(x) for x in after], [math.log(x) for x in before], equal_var=False)
    ci = res.confidence_interval(0.95)
    assert lo == pytest.approx(math.exp(ci.low)) and hi == pytest.approx(math.exp(ci.high))
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    assert ratio == pytest.approx(geo(after) / geo(before))
    assert unpaired_ratio_interval([7.47], [3.9])[1:] == (None, None)
    # the 30-minute ramp of 2026-12-07: one fresh repetition has no spread of its own, so no interval (a pooled one,
    # lent the three back-to-back repetitions' spread, read 0.91x [0.87, 0.95]: `degraded` on a healthy engine)
    assert unpaired_ratio_interval([170.0], [153.2, 154.6, 155.7])[1:] == (None, None)
    assert unpaired_ratio_interval([], [3.9]) == (None, None, None)
