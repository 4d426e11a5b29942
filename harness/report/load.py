"""Read a run folder into data frames: the only input the report has."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.common import jsonsafe
from harness.records.columnar import soak_requests_frame
from harness.records.files import (
    AFTER_SOAK,
    FAILURES,
    FILL_CHECKS,
    PHASES,
    RAMP,
    REQUESTS,
    SLICES,
    SOAK_DIR,
    VERDICTS,
    VERIFY,
    VERIFY_DIST,
    WINDOWS,
    ReadLog,
    read_jsonl,
    read_manifest,
)
from harness.records.types import Manifest
from harness.soak.canary import CANARY


@dataclass
class RunData:
    run_dir: Path
    manifest: Manifest
    phases: pd.DataFrame
    requests: pd.DataFrame
    capacity: dict[str, dict[str, Any]]
    failures: list[dict[str, Any]]
    soak_windows: list[dict[str, Any]] = field(default_factory=list)
    soak_verdicts: list[dict[str, Any]] = field(default_factory=list)
    soak_slices: list[dict[str, Any]] = field(default_factory=list)
    soak_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    verify: list[dict[str, Any]] = field(default_factory=list)
    verify_dist: list[dict[str, Any]] = field(default_factory=list)
    ramp: list[dict[str, Any]] = field(default_factory=list)
    fill_checks: list[dict[str, Any]] = field(default_factory=list)
    after_soak: list[dict[str, Any]] = field(default_factory=list)  # the measurement phases again, after each soak
    canary: list[dict[str, Any]] = field(
        default_factory=list
    )  # the soak's output canary answers (harness/soak/canary.py)
    # open-loop phases (a ``load`` key: measurement.arrival), apart: ``phases`` holds the closed-loop ones, by stream count
    arrival_phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    read_log: ReadLog = field(default_factory=ReadLog)  # what could not be read (the report's notes say it)

    @property
    def run_id(self) -> str:
        return str(self.manifest.run_id or self.run_dir.name)

    @property
    def config_names(self) -> list[str]:
        return list(self.manifest.configurations)

    @property
    def scenario(self) -> dict[str, Any]:
        return self.manifest.scenario_parsed or {}


NUM = (int, float)
# the fields a record must have, with their types, for the report to use it (docs/metrics.md)
REQUEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "config": str,
    "phase": str,
    "status": str,
    "streams": int,
    "repetition": int,
    "start_unix_s": NUM,
}
PHASE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "config": str,
    "streams": int,
    "repetition": int,
    "total_tps": NUM,
    "requests": int,
    "counters": dict,
    "cpu": dict,
}
WINDOW_FIELDS: dict[str, type | tuple[type, ...]] = {"config": str, "t_unix": NUM}
VERDICT_FIELDS: dict[str, type | tuple[type, ...]] = {"config": str, "kind": str, "t_unix": NUM}


def load_run(run_dir: Path) -> RunData:
    manifest = read_manifest(run_dir)
    log = ReadLog()
    all_phases = list(read_jsonl(run_dir / PHASES, log, PHASE_FIELDS))
    phases = pd.DataFrame([p for p in all_phases if not isinstance(p.get("load"), str)])
    arrival_phases = pd.DataFrame([p for p in all_phases if isinstance(p.get("load"), str)])
    requests = pd.DataFrame(list(read_jsonl(run_dir / REQUESTS, log, REQUEST_FIELDS)))
    capacity: dict[str, dict[str, Any]] = {}
    for f in sorted((run_dir / "capacity").glob("*.json")):
        try:
            data = jsonsafe.loads(f.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if not isinstance(data.get("config", f.stem), str):
                raise ValueError("'config' is not a string")
            capacity[data.get("config", f.stem)] = data
        except (ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
            log.skip(f, 1, f"unreadable capacity record: {exc}")
            continue
    failures = list(read_jsonl(run_dir / FAILURES, log, {"config": str}))
    # columnar and cached, in bounded memory: a soak holds ~1M records (harness/records/columnar.py)
    soak_requests = soak_requests_frame(run_dir / SOAK_DIR)
    return RunData(
        run_dir,
        manifest,
        phases,
        requests,
        capacity,
        failures,
        soak_windows=list(read_jsonl(run_dir / WINDOWS, log, WINDOW_FIELDS)),
        soak_verdicts=list(read_jsonl(run_dir / VERDICTS, log, VERDICT_FIELDS)),
        soak_slices=list(read_jsonl(run_dir / SLICES, log, {"event": str, "slice": str, "config": str})),
        soak_requests=soak_requests,
        verify=list(read_jsonl(run_dir / VERIFY, log)),
        verify_dist=list(read_jsonl(run_dir / VERIFY_DIST, log)),
        ramp=list(read_jsonl(run_dir / RAMP, log, {"config": str, "event": str})),
        fill_checks=list(read_jsonl(run_dir / FILL_CHECKS, log, {"config": str})),
        after_soak=list(read_jsonl(run_dir / AFTER_SOAK, log, PHASE_FIELDS)),
        canary=list(read_jsonl(run_dir / CANARY, log, {"config": str, "prompt_id": str, "t_unix": NUM})),
        arrival_phases=arrival_phases,
        read_log=log,
    )
