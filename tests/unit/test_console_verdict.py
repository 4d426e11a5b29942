"""The terminal verdict (harness/report/console.py) of the checked-in real run, through `specsoak report`: it fits the
width it is given, never cuts a configuration name, and marks a ratio whose interval excludes 1.0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.report.console import compact_verdict, console_lines, render
from tests.faults.helpers import cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"
NAMES = ("baseline", "ngram-map-k", "draft-self-k3")


@pytest.fixture(scope="module")
def verdict(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    run = tmp_path_factory.mktemp("console") / "run"
    shutil.copytree(FIXTURE, run)
    got = cli("report", str(run), "--out", str(run.parent / "out"), env={"COLUMNS": "100"})
    assert got.returncode == 0, got.stdout + got.stderr
    return pd.read_csv(run.parent / "out" / "verdict.csv")


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_console_verdict_fits_and_keeps_every_name_whole(verdict: pd.DataFrame, width: int) -> None:
    lines = "\n".join(console_lines(verdict, width)).splitlines()
    assert max(len(ln) for ln in lines) <= width, [ln for ln in lines if len(ln) > width]
    for name in NAMES:
        assert any(ln.split("  ")[0].strip() == name or ln == name for ln in lines), (name, lines)
    # draft-self-k3's ratios exclude 1.0: marked; ngram-map-k's straddle it: not marked
    row = next(ln for ln in lines if "draft-self-k3" in ln and "×" in ln) if width >= 80 else ""
    if width >= 80:
        assert "0.49×*" in row and "0.53×*" in row
        assert "0.91×*" not in "\n".join(lines)


def test_a_table_too_wide_becomes_one_block_per_configuration() -> None:
    table = pd.DataFrame(
        [{"configuration": "a-very-long-configuration-name-that-is-never-cut", "solo t/s": "12.3", "solo ×": "1.09×*"}]
    )
    assert render(table, 200)[0].startswith("configuration")
    narrow = render(table, 30)
    assert narrow[0] == "a-very-long-configuration-name-that-is-never-cut"
    assert all(len(ln) <= 30 for ln in narrow[1:])


def test_specsoak_report_prints_nothing_wider_than_columns(verdict: pd.DataFrame, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    got = cli("report", str(run), "--out", str(tmp_path / "o"), env={"COLUMNS": "100"})
    assert got.returncode == 0
    assert max(len(ln) for ln in got.stdout.splitlines()) <= 100, got.stdout
    assert "specsoak verdict" in got.stdout and "draft-self-k3" in got.stdout
    wide = cli("report", str(run), "--out", str(tmp_path / "o"), "--wide", env={"COLUMNS": "400"})
    assert "solo vs baseline [95% CI]" in wide.stdout  # --wide keeps the report's full table
    assert set(compact_verdict(verdict)["configuration"]) == set(NAMES)
