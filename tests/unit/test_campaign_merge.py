"""harness/report/campaign.py: which folders are one campaign, and what the merged verdict takes from where. The
manifests are this project's own (harness/run/manifest.py writes ``part`` and ``machine``); the phases' ``gpu`` is
GpuSample.to_dict's record form (harness/probe/gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.records.types import Manifest
from harness.report.campaign import campaign_notes, campaign_of, hardware_of, merge_verdict
from harness.report.load import RunData


def _run(run_id: str, part: dict[str, Any] | None, host: str, gpu: str | None = None) -> RunData:
    manifest = Manifest.from_dict(
        {"run_id": run_id, "part": part, "machine": {"hostname": host, "cpu_model": "EPYC"}, "configurations": {}}
    )
    sample = {"available": gpu is not None, "devices": [{"index": 0, "name": gpu}] if gpu else []}
    phases = pd.DataFrame([{"config": "a", "gpu": sample}])
    return RunData(Path(run_id), manifest, phases, pd.DataFrame(), {}, [])


MEASURE = {"of": "night.yaml", "soak": False, "soak_configs": []}


def _soak(*names: str) -> dict[str, Any]:
    return {"of": "night.yaml", "soak": True, "soak_configs": list(names)}


def _verdict() -> pd.DataFrame:
    rows = []
    for run in ("m", "s1", "s2"):
        for config in ("a", "b", "c"):
            soaked = (run, config) in {("s1", "b"), ("s2", "c")}
            rows.append({"run": run, "config": config, "solo_speedup": 1.0, "soak": "ok (6.00 h)" if soaked else ""})
    return pd.DataFrame(rows)


def test_the_measure_parts_rows_carry_each_soak_from_its_own_part_and_name_the_hardware() -> None:
    runs = [
        _run("m", MEASURE, "node-a", "H100"),
        _run("s1", _soak("b"), "node-b", "H100"),
        _run("s2", _soak("c"), "node-c", "L4"),
    ]
    campaign = campaign_of(runs)
    assert campaign is not None and set(campaign.soaks) == {"b", "c"}
    merged = merge_verdict(_verdict(), campaign)
    assert list(merged["run"]) == ["m", "m", "m"]
    assert list(merged["soak"]) == ["", "ok (6.00 h)", "ok (6.00 h)"]
    assert set(merged["measured_on"]) == {"node-a (EPYC; H100)"}
    soaked_on = [v if isinstance(v, str) else None for v in merged["soaked_on"]]  # not soaked: missing (None or NaN)
    assert soaked_on == [None, "node-b (EPYC; H100) (run s1)", "node-c (EPYC; L4) (run s2)"]
    notes = campaign_notes(campaign)
    # c soaked on other hardware: said, and not compared; b on the same product: no note
    assert len(notes) == 2 and "`c` soaked on other hardware (node-c (EPYC; L4))" in notes[1]
    assert hardware_of(_run("x", None, "cpu-box")).gpus == ()


def test_folders_that_are_not_one_campaign_are_reported_run_by_run() -> None:
    m, s1 = _run("m", MEASURE, "a"), _run("s1", _soak("b"), "b")
    assert campaign_of([m]) is None  # one folder is a run, not a merge
    assert campaign_of([m, _run("w", None, "a")]) is None  # a whole run beside a part
    assert campaign_of([m, _run("m2", MEASURE, "b"), s1]) is None  # two measure parts: whose ratios?
    assert campaign_of([s1, _run("s2", _soak("c"), "c")]) is None  # no measure part
    assert campaign_of([m, s1, _run("s3", _soak("b"), "c")]) is None  # b soaked twice
    other = _run("o", {**_soak("c"), "of": "other.yaml"}, "c")
    assert campaign_of([m, s1, other]) is None  # parts of another scenario
