"""A K sweep on the real engine: one configuration becomes one run per K, and the report says which K won."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.conftest import SMOLLM2, run_scenario

pytestmark = pytest.mark.engine


def test_sweep_runs_every_k_and_reports_acceptance_against_k(tmp_path: Path) -> None:
    data = {
        "name": "sweep",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2},
        "configurations": [
            {"name": "baseline"},
            {
                "name": "trunc4",
                "algorithm": "draft-simple",
                "draft": "workshop:smollm2-trunc4",
                "synthetic": {"length": 2.0},
                "k": 1,
                "sweep": {"k": [1, 3]},
            },
        ],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 16,
            "streams": [1, 2],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
    }
    run_dir = run_scenario(data, tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert list(manifest["configurations"]) == ["baseline", "trunc4-k1", "trunc4-k3"]
    assert [c.get("k") for c in manifest["configurations"].values()] == [None, 1, 3]
    cmd = manifest["configurations"]["trunc4-k3"]["command"]
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "3" and cmd[cmd.index("--spec-synth-len") + 1] == "2"
    sweep = pd.read_csv(run_dir / "k_sweep.csv")
    assert list(sweep["k"]) == [1, 3] and (sweep["acceptance"] > 0).all()
    # the same synthetic mean length L=2 at K=1 accepts every draft; at K=3 only a third of them
    assert sweep.loc[sweep["k"] == 1, "acceptance"].item() > sweep.loc[sweep["k"] == 3, "acceptance"].item()
    assert sweep["best_for"].fillna("").str.len().sum() > 0
    assert "## K sweep" in (run_dir / "report.md").read_text()
