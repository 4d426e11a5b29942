"""Run folders written before the package redesign (issue #25) give the same tables after it: `specsoak report` on the
run_quick fixture and on a real soak folder writes exactly the CSV files the code before the redesign wrote from them
(tests/fixtures/report_golden/README.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(("golden", "folder"), [("quick", "run_quick"), ("soak", "run_soak_cache")])
def test_the_report_tables_are_what_the_code_before_the_redesign_wrote(
    tmp_path: Path, golden: str, folder: str
) -> None:
    run = tmp_path / folder
    shutil.copytree(FIXTURES / folder, run)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    expected = sorted((FIXTURES / "report_golden" / golden).glob("*.csv"))
    assert {"verdict.csv", "memory.csv"} <= {f.name for f in expected}
    assert golden != "soak" or (FIXTURES / "report_golden" / golden / "soak.csv").exists()
    written = sorted(f.name for f in out.glob("*.csv"))
    assert written == [f.name for f in expected]
    for f in expected:
        assert (out / f.name).read_text() == f.read_text(), (
            f"{f.name} differs from the table written before the redesign"
        )
