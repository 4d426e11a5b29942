"""Read a run folder into data frames: the only input the report has."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import ResultsError
from harness.records import FAILURES, MANIFEST, PHASES, REQUESTS, read_jsonl


@dataclass
class RunData:
    run_dir: Path
    manifest: dict[str, Any]
    phases: pd.DataFrame
    requests: pd.DataFrame
    capacity: dict[str, dict[str, Any]]
    failures: list[dict[str, Any]]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)

    @property
    def config_names(self) -> list[str]:
        return list(self.manifest.get("configurations", {}))


def read_manifest(run_dir: Path) -> dict[str, Any]:
    mpath = run_dir / MANIFEST
    if not mpath.is_file():
        raise ResultsError(f"{run_dir}: not a run folder (no {MANIFEST})")
    try:
        data = json.loads(mpath.read_text())
    except ValueError as exc:
        raise ResultsError(f"{mpath}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{mpath}: unreadable manifest (not an object)")
    return data


def load_run(run_dir: Path) -> RunData:
    manifest = read_manifest(run_dir)
    phases = pd.DataFrame(list(read_jsonl(run_dir / PHASES)))
    requests = pd.DataFrame(list(read_jsonl(run_dir / REQUESTS)))
    capacity: dict[str, dict[str, Any]] = {}
    for f in sorted((run_dir / "capacity").glob("*.json")):
        try:
            data = json.loads(f.read_text())
            capacity[data.get("config", f.stem)] = data
        except ValueError:
            continue
    failures = list(read_jsonl(run_dir / FAILURES))
    return RunData(run_dir, manifest, phases, requests, capacity, failures)
