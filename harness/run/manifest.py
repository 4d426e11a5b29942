"""The run folder and its manifest: created for a new run, read back for a resume (with what it finds already done),
rewritten atomically each time a configuration's state changes, and closed with the stop reason."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from engines.base import Engine
from engines.logcapture import summarise_logs
from harness import __version__
from harness.common.errors import ResultsError
from harness.config.loader import LoadedScenario
from harness.config.schema import Configuration, Scenario, safe_name
from harness.records.files import FAILURES, FILL_CHECKS, MANIFEST, PHASES, RAMP, read_jsonl, write_json_atomic
from harness.records.types import Manifest
from harness.run.progress import Progress
from harness.session.observers import Observers

RESERVE = ".reserve"  # freed when the disk is full, so the manifest's stop reason can still be written
RESERVE_BYTES = 64 * 1024


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cores": os.cpu_count(),
    }
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()
        info["mem_total_mib"] = round(int(mem[1]) / 1024)
    except OSError:
        pass
    return info


def memory_bandwidth() -> dict[str, Any]:
    """Memory bandwidth, once per run, before any engine starts (the report's roofline)."""
    from harness.probe.bandwidth import measure_bandwidth

    return measure_bandwidth()


def new_run_dir(results_root: Path, scenario_name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    try:
        results_root.mkdir(parents=True, exist_ok=True)
        for n in range(100):
            d = results_root / (f"{stamp}-{safe_name(scenario_name)}" + (f"-{n}" if n else ""))
            try:
                d.mkdir()
                return d
            except FileExistsError:
                continue
    except OSError as exc:
        raise ResultsError(f"cannot create a run folder in {results_root}: {exc.strerror}") from None
    raise ResultsError(f"cannot create a run folder in {results_root}: too many runs this second")


def prepare_run_dir(run_dir: Path, scenario_text: str) -> None:
    """The scenario's copy, the logs and capacity folders, and the reserve that keeps room for the final manifest."""
    try:
        (run_dir / "scenario.yaml").write_text(scenario_text, encoding="utf-8")
        for sub in ("logs", "capacity"):
            (run_dir / sub).mkdir()
        # room for the final manifest on a disk that fills up during the run (freed by RunState.finish)
        (run_dir / RESERVE).write_bytes(b"\0" * RESERVE_BYTES)
    except OSError as exc:
        raise ResultsError(f"cannot write the run folder {run_dir}: {exc.strerror}") from None


class RunState:
    """The manifest of one run folder, and (after a resume) what the folder says is done already."""

    def __init__(self, sc: Scenario, obs: Observers, console: Console):
        self.sc = sc
        self.obs = obs
        self.console = console
        self.run_dir: Path | None = None
        self.manifest = Manifest()
        # (configuration, stream count or open-loop key, repetition) of every phase measured
        self.done_phases: set[tuple[str, int | str, int]] = set()
        self.ramp_done: set[str] = set()  # configurations whose ramp has its result record (resume)
        self.fill_done: set[str] = set()
        self.failed_before: list[str] = []

    def write(self) -> None:
        assert self.run_dir is not None
        write_json_atomic(self.run_dir / MANIFEST, self.manifest.to_dict())

    def start(self, run_dir: Path, loaded: LoadedScenario, engine_cls: type[Engine]) -> None:
        """A new run's manifest: the scenario, the engine, the machine, every configuration pending."""
        from harness.setup.doctor import engine_build_record

        self.run_dir = run_dir
        manifest: dict[str, Any] = {
            "specsoak_version": __version__,
            "run_id": run_dir.name,
            "scenario": self.sc.name,
            "scenario_file": str(loaded.path),
            "scenario_parsed": self.sc.model_dump(mode="json"),
            "engine": self.sc.server.engine,
            "engine_version": engine_cls.installed_version(),
            "engine_build": engine_build_record(),
            "machine": {**machine_info(), "memory_bandwidth": memory_bandwidth()},
            "started_unix": time.time(),
            "stopped_unix": None,
            "status": "running",
            "stop_reason": None,
            "design": {"kind": self.sc.measurement.design},
            "part": loaded.part,
            "configurations": {
                c.name: {
                    "status": "pending",
                    "algorithm": c.algorithm,
                    "synthetic": c.is_synthetic,
                    "k": c.k,
                    "sweep_of": c.sweep_of,
                    "model": str(loaded.target_of(c)),
                    "spec": c.model_dump(mode="json", exclude_none=True),
                }
                for c in self.sc.runs()
            },
        }
        self.manifest = Manifest.from_dict(manifest)
        self.write()
        self.obs.on_run_start(self.manifest)

    def resume(self, run_dir: Path) -> None:
        """A cut run's manifest read back, the resume noted in it; the phases, ramps, fill checks and failed
        configurations its records already hold."""
        from harness.records.files import read_manifest

        self.run_dir = run_dir
        self.manifest = read_manifest(run_dir)
        m = self.manifest
        m.extra.setdefault("resumes", []).append(
            {"t_unix": time.time(), "previous_status": m.status, "previous_stop_reason": m.stop_reason}
        )
        m.status, m.stop_reason, m.stopped_unix = "running", None, None
        self.done_phases = {
            (p["config"], p.get("load") or p["streams"], p["repetition"]) for p in read_jsonl(run_dir / PHASES)
        }
        # rates the adaptive sweep skipped as past saturation count as done (the manifest keeps them: they have no record)
        self.done_phases |= {
            (name, str(load), int(rep))
            for name, meta in self.manifest.configurations.items()
            for load, rep in (meta.get("sweep_skipped") or [])
        }
        self.failed_before = sorted({f["config"] for f in read_jsonl(run_dir / FAILURES) if f.get("stage") != "soak"})
        self.ramp_done = {r["config"] for r in read_jsonl(run_dir / RAMP) if r.get("event") == "result"}
        self.fill_done = {r["config"] for r in read_jsonl(run_dir / FILL_CHECKS)}
        self.write()
        self.obs.on_run_start(self.manifest)

    def set_config_status(self, name: str, **fields: Any) -> None:
        self.manifest.configurations[name].update(**fields)
        self.write()
        if "status" in fields and fields["status"] in ("done", "failed"):
            self.obs.on_config_end(name, fields["status"])

    def config_done(self, cfg: Configuration) -> bool:
        """Every phase measured, and the ramp's result written when the scenario has a ramp."""
        if self.sc.slo and self.sc.slo.ramp and cfg.name not in self.ramp_done:
            return False
        return self.phases_done(cfg)

    def phases_done(self, cfg: Configuration, rep: int | None = None) -> bool:
        """Every phase of ``cfg`` (of repetition ``rep`` only, when given) measured."""
        m = self.sc.measurement
        reps = [rep] if rep is not None else range(1, m.repetitions + 1)
        return all((cfg.name, n, r) in self.done_phases for n in m.phase_loads() for r in reps)

    def finish(self, status: str, reason: str, progress: Progress) -> None:
        """The stop reason, the engine logs' summary and the estimate against the time taken, written last."""
        if self.run_dir is not None:  # what each rotated engine log wrote, keeps and dropped (engines/logcapture.py)
            self.manifest.extra["engine_logs"] = [s.to_dict() for s in summarise_logs(self.run_dir)]
        self.manifest.extra["estimate"] = {**progress.record(), "resumed": progress.resumed}
        self.manifest.status = status
        self.manifest.stop_reason = reason
        self.manifest.stopped_unix = time.time()
        try:
            try:
                self.write()
            except ResultsError:
                # a full disk: give back the reserve made at the start so the stop reason fits
                if self.run_dir is not None:
                    (self.run_dir / RESERVE).unlink(missing_ok=True)
                self.write()
        except ResultsError as exc:
            self.console.print(f"[red]specsoak: could not write the stop reason: {exc}[/]")
        self.obs.on_run_end(status, reason)
