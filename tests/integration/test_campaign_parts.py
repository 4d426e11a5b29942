"""Issue #34's parts, run here one after another as plain processes on the real llama-server: `specsoak run --no-soak`
(the measure Job's command) and `specsoak run --soak-config ngram-map-k` (the soak Job's), merged by `specsoak report`
into the verdict one `specsoak run` of the whole scenario gives: the same rows, the same soak column, and the
hardware each figure was measured on (docs/fleet.md#collecting-and-reporting)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from harness.report.build import build_report
from tests.faults.helpers import cli
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

SCENARIO = {
    "name": "parts",
    "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "threads": 2, "stop_grace_s": 3},
    "configurations": [{"name": "baseline", "algorithm": "none"}, {"name": "ngram-map-k", "algorithm": "ngram-map-k"}],
    "measurement": {
        "prompts": "builtin:repeat",
        "max_tokens": 8,
        "streams": [1],
        "requests_per_stream": 1,
        "repetitions": 2,
        "warmup_requests": 0,
        "contamination_cores": float(os.environ.get("SPECSOAK_TEST_CONTAMINATION_CORES", "0.05")),
    },
    "soak": {
        "duration_s": 12,
        "configurations": ["ngram-map-k"],
        "shape": {"kind": "steady", "users": 1},
        "max_tokens": 8,
        "after_repetitions": 1,
        "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 4},
    },
}


def _run(path: Path, results: Path, *flags: str) -> Path:
    done = cli("run", str(path), "--results", str(results), "--no-report", *flags, timeout=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # the results folder also holds prometheus-targets/: the run is the folder with a manifest
    return next(d for d in results.iterdir() if (d / "manifest.json").exists())


def test_the_campaigns_parts_merge_into_the_verdict_of_one_run(tmp_path: Path) -> None:
    path = tmp_path / "parts.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    whole = _run(path, tmp_path / "whole")
    measure = _run(path, tmp_path / "measure", "--no-soak")
    soak = _run(path, tmp_path / "soak-ngram", "--soak-config", "ngram-map-k")
    assert json.loads((measure / "manifest.json").read_text())["part"] == {
        "of": "parts.yaml",
        "soak": False,
        "soak_configs": [],
    }
    assert json.loads((soak / "manifest.json").read_text())["part"]["soak_configs"] == ["ngram-map-k"]

    single = build_report([whole]).verdict
    merged = build_report([measure, soak], out_dir=tmp_path / "merged").verdict
    # the same rows: one per configuration, the measure part's, with its ratios
    assert list(merged["config"]) == list(single["config"]) == ["baseline", "ngram-map-k"]
    assert set(merged["run"]) == {measure.name}
    assert list(merged["algorithm"]) == list(single["algorithm"])
    assert merged["solo_speedup"].notna().all() and single["solo_speedup"].notna().all()
    # the same soak column: ngram-map-k's from its soak part (the cell that part gives alone), the baseline not soaked
    status = lambda cell: str(cell).split(" (")[0] if isinstance(cell, str) else ""
    assert [status(c) for c in merged["soak"]] == [status(c) for c in single["soak"]] == ["", "ok"]
    alone = build_report([soak], out_dir=tmp_path / "soak-alone").verdict.set_index("config")
    assert merged.set_index("config").loc["ngram-map-k", "soak"] == alone.loc["ngram-map-k", "soak"]
    # where each figure was measured: this machine, named
    host = json.loads((measure / "manifest.json").read_text())["machine"]["hostname"]
    assert all(str(v).startswith(host) for v in merged["measured_on"])
    assert merged.set_index("config").loc["ngram-map-k", "soaked_on"].endswith(f"(run {soak.name})")

    # the command a user runs: exit 0, the merge said, the hardware shown
    out = cli("report", str(measure), str(soak), "--out", str(tmp_path / "cli"), timeout=400)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    report = (tmp_path / "cli" / "report.md").read_text()
    assert "One campaign of `parts.yaml`" in report and "soaked on" in report, report[-3000:]
    # folders that are not one campaign (two whole runs) stay one row per run and configuration, each named
    both = build_report([whole, measure], out_dir=tmp_path / "both").verdict
    assert len(both) == 4 and both["measured_on"].notna().all()
