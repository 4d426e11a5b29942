"""Run a scenario: per configuration, start the engine, read its capacity, measure, stop it.

Everything measured is written to the run folder as it arrives (harness/records/files.py);
the report is rebuilt from that folder alone. An engine that fails a configuration is a
recorded failure of that configuration, and the run goes on with the next one. The Runner orchestrates:
the manifest and resume state are harness/run/manifest.py, one phase harness/run/phases.py, the SLO ramp
harness/run/ramp.py, the soak campaign harness/run/campaign.py.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from engines import engine_class
from harness.common.errors import EngineError, ResultsError, ScenarioError
from harness.common.net import free_port
from harness.config.loader import LoadedScenario
from harness.config.schema import Configuration, load_label, safe_name
from harness.detect.saturation import Judgement, Rule, judge, stop_sweep
from harness.load.client import RequestParams
from harness.load.schedule import arrival_prompt_offset, schedule
from harness.prompts import PromptError, load_prompts
from harness.records.files import AFTER_SOAK, JsonlWriter, write_json_atomic
from harness.records.types import Phase
from harness.run.campaign import soak_campaign
from harness.run.interrupt import PhaseInterruption, RunInterrupted
from harness.run.manifest import RESERVE, RunState, new_run_dir, prepare_run_dir
from harness.run.order import block_order, prompt_offset
from harness.run.outputs import PhaseWriter, RunOutputs
from harness.run.phases import PhaseExecutor, PhaseSpec
from harness.run.progress import Progress
from harness.run.ramp import run_ramp
from harness.run.verify import Verifier, VerifyOptions
from harness.session.engine import EngineSession, RunContext, launch_spec
from harness.session.observers import Observers, RunObserver


@dataclass
class RunResult:
    run_dir: Path
    status: str
    failed_configs: list[str] = field(default_factory=list)
    # configurations whose soak crashed, hung, gave up, collapsed or ran out of memory (exit code 4)
    soak_failures: list[str] = field(default_factory=list)


class Runner:
    """One run of a scenario: the measured phases (interleaved blocks or sequential), the ramp, the fill check and the
    soak, in that order, into a new run folder or one a cut run left (``run(resume_dir)``)."""

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
        self.state = RunState(self.sc, self.obs, self.console)  # the manifest, and what a resume finds done
        # SIGTERM/SIGINT during a phase: the phase's loop and stop event (see run(), docs/reliability.md)
        self.interruption = PhaseInterruption()
        self.progress = Progress.of(self.sc)  # where the run is, and how long it has left (harness/run/progress.py)
        # measurement.verify: greedy answers taken on the run's own engines, compared once every configuration is measured
        self.verifier: Verifier | None = None
        self.verify_answers: dict[str, dict[str, Any]] = {}

    # ---- the run ---------------------------------------------------------------------
    def run(self, resume_dir: Path | None = None) -> RunResult:
        """Run the scenario into a new folder, or (``resume_dir``) finish what a cut run left undone."""
        state = self.state
        if resume_dir is None:
            run_dir = new_run_dir(self.results_root, self.sc.name)
            prepare_run_dir(run_dir, self.loaded.text)
            state.start(run_dir, self.loaded, self.engine_cls)
            self.console.print(f"specsoak: run folder {run_dir}")
        else:
            run_dir = resume_dir
            state.resume(run_dir)
            self.console.print(f"specsoak: resuming {run_dir} ({len(state.done_phases)} phases already measured)")
        failed: list[str] = list(state.failed_before)
        self.progress = Progress.of(self.sc, len(state.done_phases))
        self.console.print(self.progress.line("plan"), highlight=False)
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.interruption.cut(name):
                return  # during a phase: the requests in flight are cut (recorded as 'interrupted'), then the run stops
            raise RunInterrupted(name)  # between phases, or a second signal

        for s in old:
            signal.signal(s, on_signal)
        self.ctx = RunContext(self.loaded, run_dir, self.console, self.obs, self.engine_cls, self.params)
        if (v := self.sc.measurement.verify) is not None and not self._verified():
            opts = VerifyOptions(streams=v.streams, prompts=v.prompts, max_tokens=v.max_tokens)
            self.verifier = Verifier(self.loaded, self.results_root, opts, self.console, into=run_dir)
        self.out = RunOutputs.open(run_dir, self.obs)
        self.phases = PhaseExecutor(self.ctx, self.prompts, self.wall_anchor, self.out.requests, self.interruption)
        try:
            if self.sc.measurement.design == "interleaved":
                self._interleaved(failed)
            for cfg in self.sc.runs():
                if cfg.name in failed:
                    continue
                if not state.config_done(cfg):
                    ok = self._run_config(cfg)
                    if not ok:
                        failed.append(cfg.name)
                        continue
                elif state.manifest.configurations[cfg.name].status != "done":
                    state.set_config_status(cfg.name, status="done")  # measured in the interleaved blocks
                if self.sc.report.fill_check and cfg.name not in state.fill_done:
                    self._fill_check(cfg)
            if self.verifier is not None:
                self._verify()
            soak_failed: list[str] = []
            stopped_run: str | None = None
            if self.sc.soak is not None:
                soak_failed, stopped_run = soak_campaign(
                    self.ctx, state, self.progress, self.out.failures, failed, self._after_soak
                )
            status = "completed" if not failed and not soak_failed else "completed_with_failures"
            reasons = []
            if failed:
                reasons.append(f"configurations failed: {', '.join(failed)}")
            if soak_failed:
                reasons.append(f"soak failed: {', '.join(soak_failed)}")
            if stopped_run:
                status, reasons = "stopped_by_verdict", [f"the run was stopped by a verdict: {stopped_run}", *reasons]
            state.finish(status, "; ".join(reasons) or "all configurations measured", self.progress)
            (run_dir / RESERVE).unlink(missing_ok=True)
            return RunResult(run_dir, status, failed, soak_failed)
        except RunInterrupted as exc:
            state.finish(
                "interrupted",
                f"{exc.signame} received; records written before it are kept, requests in flight recorded as 'interrupted'",
                self.progress,
            )
            raise
        except BaseException as exc:
            state.finish(
                "failed", str(exc) if isinstance(exc, ResultsError) else f"{type(exc).__name__}: {exc}", self.progress
            )
            raise
        finally:
            self.out.close()
            self.ctx.gpu.close()
            for s, h in old.items():
                signal.signal(s, h)

    def _after_soak(self, cfg: Configuration, session: EngineSession) -> None:
        """The measurement phases again on the soaked engine: the report's before/after (machine drift and engine aging)."""
        self.console.print(
            f"  {cfg.name}: the measurement phases again after the soak (engine up {session.uptime_s() or 0:,.0f} s)"
        )
        out = PhaseWriter(JsonlWriter(self.ctx.run_dir / AFTER_SOAK), None)
        try:
            assert self.sc.soak is not None
            reps = list(range(1, self.sc.soak.after_repetitions + 1))
            self._measure(cfg, session, out, phase="after_soak", warmup=False, reps=reps)
        finally:
            out.close()

    def _verified(self) -> bool:
        v = self.state.manifest.verify  # a resumed run whose comparison is already written
        return v is not None and v.status == "completed"

    def _verify_answers(self, cfg: Configuration, session: EngineSession) -> None:
        """``cfg``'s greedy answers for measurement.verify, on the engine that has just measured it."""
        if self.verifier is not None and cfg.name not in self.verify_answers and self.verifier.wants(cfg):
            got = self.verifier.collect(session.engine, cfg)
            if got is not None:
                self.verify_answers[cfg.name] = got

    def _verify(self) -> None:
        """The comparison (verify.jsonl, the manifest's ``verify``); an engine it had to start and lost is said, and
        the run goes on to its soak."""
        assert self.verifier is not None
        try:
            _, same = self.verifier.run(self.state.manifest, self.verify_answers)
            self.console.print(
                "  verify: every speculative configuration's greedy output equals its baseline's"
                if same
                else "  [red]verify: a speculative configuration's greedy output differs from its baseline's (verify.jsonl)[/]"
            )
        except EngineError as exc:
            self.console.print(f"  [red]verify failed ({type(exc).__name__}): {exc}[/]")
        self.state.write()

    def _run_config(self, cfg: Configuration) -> bool:
        """What is left of a configuration on one engine: its phases not yet measured (all of them in the
        sequential design), then its ramp. False when the engine failed (recorded)."""

        def body(session: EngineSession, where: dict[str, str]) -> None:
            if not self.state.phases_done(cfg):
                self._measure(cfg, session, self.out.phases)
            self._verify_answers(cfg, session)
            if self.sc.slo and self.sc.slo.ramp and cfg.name not in self.state.ramp_done:
                where["stage"] = "ramp"
                run_ramp(self.phases, cfg, session, self.sc.slo, self.out.ramp, self.console)
                self.state.ramp_done.add(cfg.name)

        ok = self._with_engine(cfg, None, body)
        if ok:
            self.state.set_config_status(cfg.name, status="done")
        return ok

    def _interleaved(self, failed: list[str]) -> None:
        """The interleaved design (docs/reports.md#design): repetition r is a block that measures every configuration
        once, in an order shuffled per block from a recorded seed, each on a fresh engine; so repetition r of a
        configuration and of its baseline are seconds apart, and a machine that speeds up or slows down over minutes
        moves both. The ramp and the fill check follow, per configuration, in the main loop."""
        m = self.sc.measurement
        design = self.state.manifest.design
        design.setdefault("kind", "interleaved")
        if design.get("order_seed") is None:
            design["order_seed"] = m.order_seed if m.order_seed is not None else random.SystemRandom().randrange(2**31)
        seed = int(design["order_seed"])
        design.setdefault("blocks", [])
        self.state.write()
        cfgs = [c for c in self.sc.runs() if c.name not in failed]
        for rep in range(1, m.repetitions + 1):
            order = block_order([c.name for c in cfgs], seed, rep)
            if not any(b.get("repetition") == rep for b in design["blocks"]):
                design["blocks"].append({"repetition": rep, "order": order, "start_unix_s": time.time()})
                self.state.write()
            self.console.print(f"[bold]block {rep}/{m.repetitions}[/]: {', '.join(order)}")
            by_name = {c.name: c for c in cfgs}
            for name in order:
                cfg = by_name[name]
                if cfg.name in failed or self.state.phases_done(cfg, rep):
                    continue

                def body(
                    session: EngineSession, _where: dict[str, str], cfg: Configuration = cfg, rep: int = rep
                ) -> None:
                    self._measure(cfg, session, self.out.phases, reps=[rep])
                    self._verify_answers(cfg, session)

                if not self._with_engine(cfg, f"block{rep}", body):
                    failed.append(cfg.name)

    def _with_engine(
        self, cfg: Configuration, log_stage: str | None, body: Callable[[EngineSession, dict[str, str]], None]
    ) -> bool:
        """Start ``cfg``'s engine (ready, speculation checked, capacity recorded), run ``body(session, where)``, stop
        the engine. False when the engine failed: a failure record says at which stage (``where["stage"]``)."""
        name = safe_name(cfg.name)
        session = self.ctx.session(cfg, log_stage)
        self.console.print(
            f"[bold]{cfg.name}[/] ({cfg.algorithm}{', synthetic' if cfg.is_synthetic else ''}): starting {self.engine_cls.name}"
            + (f" ({log_stage})" if log_stage else "")
        )
        self.state.set_config_status(cfg.name, status="starting", command=session.display_command())
        where = {"stage": "start"}
        try:
            ready_s = session.start()
            where["stage"] = "capacity"
            capacity = session.capacity()
            cap_record = {"config": cfg.name, "ready_s": ready_s, **capacity.to_dict()}
            write_json_atomic(self.ctx.run_dir / "capacity" / f"{name}.json", cap_record)
            self.obs.on_capacity(cfg.name, capacity, ready_s)
            self.console.print(
                f"  ready in {ready_s:.1f} s: {capacity.slots} slots x {capacity.ctx_per_slot} ctx, "
                f"KV {capacity.target.kv_mib} MiB"
                + (f", draft KV {capacity.draft.kv_mib} MiB" if capacity.draft else "")
            )
            self.state.set_config_status(cfg.name, status="measuring", pid=session.pid)
            where["stage"] = "measure"
            body(session, where)
            return True
        except EngineError as exc:
            kind = type(exc).__name__
            stage = where["stage"]
            if stage == "start" and session.starts and session.ready_s is not None:
                stage = "speculation"  # ready, but the speculation asked for is not active
            self.out.failures.write(
                {
                    "config": cfg.name,
                    "stage": stage,
                    "kind": kind,
                    "message": str(exc),
                    "unix_s": time.time(),
                    "log": str(session.log_path),
                }
            )
            self.state.set_config_status(cfg.name, status="failed", failure_kind=kind, failure=str(exc))
            self.console.print(f"  [red]configuration failed ({kind}): {exc}[/]")
            return False
        finally:
            code = session.stop()
            self.state.manifest.configurations[cfg.name].update(engine_exit=code)
            self.state.write()

    def _measure(
        self,
        cfg: Configuration,
        session: EngineSession,
        out: PhaseWriter,
        phase: str = "measure",
        warmup: bool = True,
        reps: list[int] | None = None,
    ) -> None:
        """The phases of ``reps`` (default: every repetition) at every stream count (or open-loop rate), on ``session``'s
        engine, after a warm-up.

        Phase (N, r) sends the same prompts whatever the design or configuration (``prompt_offset``): repetition r of a
        configuration and of its baseline answer the same prompts; the repetitions differ in their prompts. An open-loop
        phase (``measurement.arrival``) also has the same schedule in every configuration (harness/load/arrivals.py).
        After a soak, repetition r takes the prompts (and schedule) of repetition ((r - 1) mod repetitions) + 1."""
        m = self.sc.measurement
        if m.warmup_requests and warmup:
            self.phases.run(
                cfg, session, PhaseSpec("warmup", streams=1, repetition=0, requests_per_stream=m.warmup_requests), None
            )
        # the adaptive sweep (measurement.arrival.saturation.stop_after): per repetition, the judgements of its rates so far
        judged: dict[int, list[Judgement]] = {}
        for load in m.phase_loads():
            for rep in reps or range(1, m.repetitions + 1):
                if (
                    phase == "measure"
                    and isinstance(load, str)
                    and m.arrival is not None
                    and stop_sweep(judged.get(rep, []), m.arrival.saturation.stop_after)
                ):
                    # done for this run: recorded in the manifest, so neither the catch-up nor a resume measures it
                    self.state.done_phases.add((cfg.name, load, rep))
                    skipped = self.state.manifest.configurations[cfg.name].extra.setdefault("sweep_skipped", [])
                    if [load, rep] not in skipped:
                        skipped.append([load, rep])
                        self.state.write()
                    self.console.print(
                        f"  {load_label(load)} rep {rep}: skipped, past saturation (saturation.stop_after {m.arrival.saturation.stop_after})"
                    )
                    continue
                if phase == "measure" and (cfg.name, load, rep) in self.state.done_phases:
                    continue
                self.state.done_phases.discard((cfg.name, load, rep))
                like = (rep - 1) % m.repetitions + 1  # the repetition whose prompts and schedule this one takes
                if isinstance(load, str):  # open loop: the same schedule as before the soak (after it too)
                    rec = self._arrival_phase(cfg, session, out, load, rep, phase, like)
                    assert m.arrival is not None
                    judged.setdefault(rep, []).append(judge(rec.to_dict(), Rule.of(m.arrival.saturation)))
                else:
                    offset = prompt_offset(m.requests_per_stream, m.streams, m.repetitions, load, like)
                    rec = self.phases.run(
                        cfg, session, PhaseSpec(phase, load, rep, m.requests_per_stream, offset), out
                    ).record
                if phase == "measure":
                    self.state.done_phases.add((cfg.name, load, rep))
                    self.progress.phase_done()
                if isinstance(load, str):
                    self._say_progress(phase, cfg, load, rep)
                    continue
                streams = load
                acc = rec.get("acceptance")
                self.console.print(
                    f"  {'after soak: ' if phase == 'after_soak' else ''}{streams:>3} stream{'s' if streams > 1 else ' '} "
                    f"rep {rep}: {rec.total_tps or 0:.1f} t/s total"
                    + (
                        f", solo decode {rec.median_decode_tps:.1f} t/s"
                        if streams == 1 and rec.median_decode_tps
                        else ""
                    )
                    + (f", acceptance {acc:.2f}" if acc is not None else "")
                    + f", errors {rec.errors}, other CPU {rec.cpu['other_cores']:.3f} cores"
                    + (" [yellow](contaminated)[/]" if rec.contaminated else "")
                )
                self._say_progress(phase, cfg, load, rep)

    def _say_progress(self, phase: str, cfg: Configuration, load: int | str, rep: int) -> None:
        """After a measured phase: where the run is and how long it has left."""
        if phase != "measure":
            return
        block = (
            f"block {rep}/{self.sc.measurement.repetitions} · " if self.sc.measurement.design == "interleaved" else ""
        )
        what = load_label(load) if isinstance(load, str) else f"{load} stream{'s' if load > 1 else ''}"
        self.console.print(self.progress.line(f"{block}{cfg.name} · {what} rep {rep}"), highlight=False)

    def _arrival_phase(
        self,
        cfg: Configuration,
        session: EngineSession,
        out: PhaseWriter | None,
        key: str,
        rep: int,
        phase: str = "measure",
        like: int | None = None,
    ) -> Phase:
        """One open-loop phase: phase ``arrivals`` of ``key`` (a rate, or the stage list), repetition ``rep``; after a
        soak (``phase`` after_soak) the schedule and prompts of repetition ``like`` again, as phase ``after_soak``."""
        m = self.sc.measurement
        assert m.arrival is not None
        like = like or rep
        sched = schedule(m.arrival, key, like)
        spec = PhaseSpec(
            "after_soak" if phase == "after_soak" else "arrivals",
            m.arrival.max_in_flight,
            rep,
            len(sched),
            arrival_prompt_offset(m.arrival, m.repetitions, key, like),
            arrival=(key, sched),
        )
        rec = self.phases.run(cfg, session, spec, out).record
        gp = rec.get("goodput_rps")
        late = rec.get("late")
        self.console.print(
            f"  {'after soak: ' if phase == 'after_soak' else ''}{load_label(key)} rep {rep}: "
            f"offered {rec.get('offered_rps') or 0:.2f} rps, achieved {rec.get('achieved_rps') or 0:.2f}"
            + (f", goodput {gp:.2f}" if gp is not None else "")
            + f", late {late}/{rec.get('scheduled')}"
            + (f" (max delay {rec.get('max_send_delay_s'):.2f} s)" if late else "")
            + f", {rec.total_tps or 0:.1f} t/s total, errors {rec.errors}, other CPU {rec.cpu['other_cores']:.3f} cores"
            + (" [yellow](contaminated)[/]" if rec.contaminated else "")
        )
        j = judge(rec.to_dict(), Rule.of(m.arrival.saturation))
        if j.saturated:
            self.console.print(f"    saturated: {j.why}")
        return rec

    def _fill_check(self, cfg: Configuration) -> None:
        """The memory table's servable context, proven: restart at it and fill every slot (harness/session/fillcheck.py)."""
        from harness.session.fillcheck import fill_check

        assert self.sc.report.memory_budget_mib is not None
        run_dir = self.ctx.run_dir
        name = safe_name(cfg.name)
        cap_file = run_dir / "capacity" / f"{name}.json"
        try:
            cap = json.loads(cap_file.read_text())
        except (OSError, ValueError) as exc:
            self.console.print(f"  [yellow]fill check skipped: {cap_file}: {exc}[/]")
            return
        srv = self.sc.server
        rec = fill_check(
            self.engine_cls,
            launch_spec(self.loaded, cfg, free_port()),
            cap,
            self.sc.report.memory_budget_mib,
            run_dir / "logs" / f"{name}.fill.server.log",
            srv.start_timeout_s,
            srv.request_timeout_s,
            srv.stop_grace_s,
            say=self.console.print,
        )
        self.out.fill_checks.write(rec)
        self.state.fill_done.add(cfg.name)
        self.state.manifest.configurations[cfg.name].update(fill_check=rec["status"])
        self.state.write()
        colour = "green" if rec["status"] == "ok" else "yellow"
        self.console.print(f"  [{colour}]fill check {rec['status']}[/]: {rec.get('detail', '')}")
