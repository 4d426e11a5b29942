"""The soak: hours of Locust traffic against one long-lived engine, under a watchdog.

By default a configuration's engine lives through its whole soak (one slice); it is restarted
only by the watchdog. ``soak.slice_s`` alternates configurations instead, restarting each
engine every slice (which resets the state a late collapse needs: ``validate`` warns).

Every ``window_s`` the watchdog closes a window (``windows.jsonl``: aggregates, the load level,
the engine's uptime, the change detector's state, the memory headroom) and may give verdicts
(``verdicts.jsonl``, each with its time, the engine's uptime, its evidence and the action taken):

- ``crash``: the engine process exited; ``hang``: it did not answer its readiness probe for ``hang_s``;
- ``collapse`` / ``recovered``: a watched window series (output t/s, decode t/s, TTFT p95, error
  share, acceptance, engine memory) departed from its reference at the same load level and stayed
  there (harness/detect/changepoint.py), or came back;
- ``memory``: at the engine's current memory slope, the machine's available memory runs out
  within ``memory_horizon_s``;
- ``error_rate``: a window's failed share reached the threshold;
- ``drift``: a slow trend over the whole soak (harness/detect/trend.py);
- ``restart_failed`` / ``gave_up``: the engine could not be brought back / too many restarts;
- ``no_load``: Locust sent nothing;
- ``divergence``: the output canary's greedy answers changed (harness/soak/canary.py).
- ``disk``: the results disk runs short (harness/soak/disk.py).

What each kind does is the scenario's ``soak.watchdog.actions`` (record, restart, stop the
configuration, stop the run); docs/soak.md has the defaults.

This module does the I/O: the engine's supervision, Locust, the records' tail, the writing of windows and verdicts
(typed records: harness/records/types.py). A window is assembled by harness/soak/assemble.py and judged by the
rules of harness/soak/watchdog.py, both pure.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from engines.types import EngineCounters
from harness.common.errors import EngineError
from harness.config.policy import FAILURE_KINDS
from harness.config.schema import Configuration, Soak, Watchdog
from harness.detect.changepoint import ChangeDetector, DetectorSettings
from harness.load.locust_proc import LocustProcess
from harness.load.pacing import window_traffic
from harness.load.schedule import soak_offsets
from harness.load.shapes import users_at
from harness.load.workers import lost_arrivals
from harness.probe.cpu import CpuMeter
from harness.probe.memory import rss_bytes, tree_memory, tree_rss_bytes
from harness.prompts.lengths import soak_prompts
from harness.records.files import SLICES, SOAK_DIR, VERDICTS, WINDOWS, JsonlWriter, RequestRecord, read_jsonl
from harness.records.types import Verdict
from harness.session.engine import EngineSession, RunContext
from harness.soak import canary as canary_mod
from harness.soak.assemble import detector_states, judged_window, live_window, settle_window, window_delta
from harness.soak.disk import DiskWatch
from harness.soak.explain import explain
from harness.soak.figures import longest_stall, memory_figures
from harness.soak.health import HealthProbe
from harness.soak.prefill import Ask, PrefillModel, ask_of
from harness.soak.speed import Span, SpeedModel, span_of
from harness.soak.tail import LogFollower, RecordTail
from harness.soak.watchdog import WatchState, headroom, judge
from harness.soak.windows import Backlog, end_unix, outstanding, take_ended

OBSERVED_FAILURES = (*FAILURE_KINDS, "error_rate", "no_load", "stall", "disk", "worker_lost")
EXPLAINED = (
    "collapse",
    "stall",
    "divergence",
    "memory",
)  # verdicts whose evidence lists the series that moved with them
# a window is judged this many windows after it closes: the requests that streamed in it have ended by then
# (a record is written when its request ends), so its throughput counts their tokens (harness/soak/windows.py)
SETTLE_WINDOWS = 1


@dataclass
class SliceResult:
    elapsed_s: float
    restarts: int
    verdicts: int
    gave_up: bool
    outcome: SliceOutcome


def detector_settings(wd: Watchdog) -> DetectorSettings:
    return DetectorSettings(
        warmup_windows=wd.warmup_windows, reference_windows=wd.reference_windows, confirm_windows=wd.confirm_windows
    )


def replay_detector(wd: Watchdog, windows: list[dict[str, Any]]) -> ChangeDetector:
    """A configuration's detector as it stood after these windows (resume: the soak goes on where it was)."""
    det = ChangeDetector(detector_settings(wd))
    for w in windows:
        if w.get("engine_restart"):
            det.engine_restarted()
        det.update(w)
    return det


def soak_elapsed(run_dir: Path) -> tuple[dict[str, float], int]:
    """Soak seconds each configuration has had (ended slices + the recorded part of a cut one), and slices started."""
    elapsed: dict[str, float] = defaultdict(float)
    starts: dict[str, dict[str, Any]] = {}
    n = 0
    for ev in read_jsonl(run_dir / SLICES):
        if ev.get("event") == "start":
            starts[ev["slice"]] = ev
            n += 1
        elif ev.get("event") == "end":
            starts.pop(ev["slice"], None)
            elapsed[ev["config"]] += float(ev["elapsed_s"])
    for sid, ev in starts.items():  # cut short by a crash of the harness: count what was recorded
        last = 0.0
        for f in (run_dir / SOAK_DIR).glob(f"{sid}-*.jsonl"):
            for r in read_jsonl(f):
                last = max(last, float(r.get("start_unix_s") or 0) + float(r.get("e2e_s") or 0))
        if last > ev["t_unix"]:
            elapsed[ev["config"]] += last - ev["t_unix"]
    return dict(elapsed), n


@dataclass
class SliceOutcome:
    stop: str | None = None  # "config" or "run" when a verdict's action ended it
    why: str | None = None


class SoakSlice:
    """``slice_s`` of Locust load against a session the caller started; the watchdog acts on what it sees."""

    def __init__(
        self,
        ctx: RunContext,
        cfg: Configuration,
        session: EngineSession,
        slice_id: str,
        slice_s: float,
        offset_s: float,
        history: dict[str, list[dict[str, Any]]],
        detector: ChangeDetector,
        speed: SpeedModel | None = None,
        prefill: PrefillModel | None = None,
    ):
        self.ctx = ctx
        self.cfg = cfg
        self.session = session
        assert ctx.sc.soak is not None, "a slice belongs to a scenario with a soak: section"
        self.soak: Soak = ctx.sc.soak
        self.wd = self.soak.watchdog
        self.slice_id = slice_id
        self.slice_s = slice_s
        self.offset_s = offset_s
        self.run_dir: Path = ctx.run_dir
        self.history = history  # config -> windows so far (drift needs the whole soak)
        self.detector = detector
        # the configuration's speed curve (harness/soak/speed.py), learned from its first windows; kept across slices
        self.speed = speed if speed is not None else SpeedModel()
        # and its prefill model (harness/soak/prefill.py): TTFT less the wait for a slot, at any load
        self.prefill = prefill if prefill is not None else PrefillModel(ctx.sc.server.parallel)
        self.restarts = 0
        self.verdict_count = 0
        self.outcome = SliceOutcome()
        # what the watchdog's rules remember (harness/soak/watchdog.py); a drift is named once per soak, resumed or not
        self.state = WatchState(
            drift_flagged={
                v["metric"]
                for v in read_jsonl(self.run_dir / VERDICTS)
                if v.get("config") == cfg.name and v.get("kind") == "drift"
            }
        )
        self.disk = DiskWatch(
            self.run_dir, self.wd
        )  # the results disk's free space, once a window (harness/soak/disk.py)
        self.log_follower = LogFollower()
        self.cache_seen: Any = None  # the prompt cache as the engine last logged it
        # the engine's health, asked from a thread of its own (harness/soak/health.py); its readings go to the open window
        self.probe = HealthProbe(self._ask_health, self.wd.probe_interval_s, min(5.0, max(0.5, self.wd.hang_s / 3)))
        self.tail = RecordTail()
        self.records_seen = 0
        self.window: list[dict[str, Any]] = []
        # closed windows (and the engine counters at their end) waiting SETTLE_WINDOWS for their requests to end
        self.pending: list[tuple[dict[str, Any], EngineCounters | None]] = []
        self.unassigned: list[
            dict[str, Any]
        ] = []  # records not yet given to a window (by end time), or still streaming
        self.ends: list[float] = []  # end times of the slice's records, ascending (the open-loop backlog)
        # (start, end) of the slice's recent records: which of a window's requests ran alone (open loop)
        self.intervals: list[tuple[float, float]] = []
        self.longest_s = 0.0  # the longest of them
        self.spans: list[Span] = []  # the same records' decode spans: each window's speed index
        self.asks: list[Ask] = []  # and their first tokens, in order sent: each window's prefill index
        self.backlog = Backlog()  # this slice's judged windows, as the open-loop backlog's state reads them
        self.window_t0 = 0.0
        self.window_counters: EngineCounters | None = None
        self.engine_restarted = True  # the first window after an engine start says so (detector warm-up on replay)
        self.t_load = time.time()
        self.verdicts = JsonlWriter(self.run_dir / VERDICTS)
        self.windows = JsonlWriter(self.run_dir / WINDOWS)
        # CPU per window: engine, harness (this process and its Locust processes), everything else
        self.locust_pids: tuple[int, ...] = ()
        self.cpu_meter: CpuMeter | None = None
        # open loop: the slice's schedule (soak seconds) and the unix time its offset_s went out (the pacing user's start)
        self.arrival = self.soak.arrival.model_dump() if self.soak.arrival is not None else None
        self.schedule = (
            soak_offsets(self.arrival, offset_s, offset_s + slice_s, self.soak.duration_s)
            if self.arrival is not None
            else np.zeros(0)
        )
        self.pacing_t0: float | None = None
        # remote workers: the master's events, and the arrivals lost with a worker (left out of self.schedule)
        self.worker_tail = RecordTail()
        self.remote_workers: dict[str, dict[str, Any]] = {}
        self.worker_summary: list[dict[str, Any]] = []
        self.schedule_full = self.schedule
        self.schedule_lost = np.zeros(len(self.schedule), dtype=bool)
        self.canary: canary_mod.Canary | None = None

    # ---- verdicts --------------------------------------------------------------------
    def verdict(
        self, kind: str, message: str, evidence: dict[str, Any], metric: str | None = None, action: str | None = None
    ) -> str:
        """Write a verdict, tell the observers, and return the action to take (the scenario's, unless given)."""
        action = action or self.wd.action(kind)
        if kind in EXPLAINED:
            onset = float(
                evidence.get("onset_unix")
                or (self.history.get(self.cfg.name) or [{}])[-1].get("t_start_unix")
                or time.time()
            )
            why = explain(self.history.get(self.cfg.name, []), onset, metric or kind)
            evidence = {**evidence, "explanation": why.to_dict()}
            message = f"{message}; {why.text()}"
        if action == "restart" and self.session.attached:
            action = "stop_config"  # an attached server is not specsoak's to restart: its soak ends, the verdict stays
            message = f"attached server: {message}"
        now = time.time()
        rec = Verdict(
            now,
            self.cfg.name,
            self.slice_id,
            kind,
            metric,
            message,
            evidence,
            action,
            self.session.uptime_s(now),
            self.session.pid,
        )
        self.verdicts.write(rec.to_dict())
        self.verdict_count += 1
        self.ctx.obs.on_verdict(rec)
        if kind in OBSERVED_FAILURES:
            self.ctx.obs.on_failure(rec.failure())
        up = rec.engine_uptime_s
        colour = "red" if kind in FAILURE_KINDS else "yellow"
        self.ctx.console.print(
            f"  [{colour}]watchdog: {kind}{f' ({metric})' if metric else ''} at engine uptime "
            f"{_hours(up)}: {message} -> {action}[/]",
            highlight=False,
        )
        if action in ("stop_config", "stop_run") and self.outcome.stop is None:
            self.outcome = SliceOutcome(
                "config" if action == "stop_config" else "run", f"{kind}{f' ({metric})' if metric else ''}: {message}"
            )
        return action

    def _canary_round(self, div: canary_mod.Divergence | None) -> None:
        """A finished canary round: to the observers, its errors said, and a divergence judged by the rule a verdict."""
        assert self.canary is not None
        summary = self.canary.summary()
        self.ctx.obs.on_canary(summary)
        if summary.errors:
            self.ctx.console.print(
                f"  [yellow]canary: {summary.errors} of {summary.answers} answers failed: {summary.error}[/]",
                highlight=False,
            )
        if div is not None:
            at = f"{'token' if div.method == 'tokens' else 'character'} {div.first_diff}"
            self.verdict("divergence", f"{div.why} (first difference at {at})", div.evidence())

    # ---- engine ----------------------------------------------------------------------
    def _restart(self, why: str) -> bool:
        """Kill what is left and start again on the same port; a failed start is retried until max_restarts."""
        kill = why == "hang"
        while True:
            if self.restarts >= self.wd.max_restarts:
                self.session.stop(0 if kill else None)
                self.verdict(
                    "gave_up",
                    f"{self.restarts} restarts already; the configuration's soak ends",
                    {"restarts": self.restarts},
                    action="stop_config",
                )
                return False
            self.restarts += 1
            try:
                self.session.restart(kill=kill)
            except EngineError as exc:
                self.verdict("restart_failed", str(exc), {"after": why, "restarts": self.restarts}, action="retry")
                kill = True
                continue
            self.window_counters = self._scrape()
            self.probe.reset()
            self.engine_restarted = True  # the next window says so; the detector's warm-up starts there, as in a replay
            self.state.engine_restarted()
            self.cache_seen = None
            if self.cpu_meter is not None:
                self.cpu_meter = CpuMeter(self.session.pid, client_pids=self.locust_pids).start()
            return True

    def _scrape(self) -> EngineCounters | None:
        try:
            return self.session.engine.scrape()
        except EngineError:
            return None

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> SliceResult:
        slices = JsonlWriter(self.run_dir / SLICES)
        t_start = time.time()
        slices.write(
            {
                "event": "start",
                "slice": self.slice_id,
                "config": self.cfg.name,
                "t_unix": t_start,
                "offset_s": self.offset_s,
                "slice_s": self.slice_s,
                "engine_pid": self.session.pid,
                "engine_started_unix": self.session.started_unix,
                # the speed curve's measured streams against the most the soak can decode (docs/detector.md#speed-index)
                "curve_streams": self.speed.k_max,
                "soak_streams": min(self.ctx.sc.server.parallel, self.soak.peak_streams()),
            }
        )
        self.engine_restarted = (
            True  # warm-up: a new engine, or the first windows of a resumed soak (the first window says so)
        )
        key = self.session.engine.spec.api_key
        locust = LocustProcess(
            self._locust_config(),
            self.run_dir / SOAK_DIR,
            self.run_dir / "logs",
            self.soak.workers,
            secret_env={"SPECSOAK_LOCUST_API_KEY": key} if key else None,
            remote=self.soak.remote_workers.model_dump() if self.soak.remote_workers is not None else None,
        )
        gave_up = False
        t_load = self.t_load = time.time()
        try:
            self.canary = canary_mod.for_slice(self.ctx, self.cfg, self.session, self.slice_id)
            if (
                self.canary is not None
            ):  # its first round before the traffic (the reference is the engine's answer alone) and the first window
                self._canary_round(self.canary.first_round())
            self.window_t0 = time.time()
            self.window_counters = self._scrape()
            self.probe.start()
            t_load = self.t_load = time.time()
            locust.start()
            self.locust_pids = tuple(locust.pids)
            self.cpu_meter = CpuMeter(self.session.pid, client_pids=self.locust_pids).start()
            wait_s = self.soak.remote_workers.wait_s if self.soak.remote_workers is not None else 0.0
            hard_stop = time.monotonic() + self.slice_s + 120 + wait_s
            while locust.alive() and time.monotonic() < hard_stop and self.outcome.stop is None:
                time.sleep(self.wd.probe_interval_s)
                if not self.session.alive():
                    engine = self.session.engine
                    code = engine.proc.returncode if engine.proc else None
                    reason = engine.failure_reason(engine.read_log()) or "no reason in its log"
                    what = (
                        f"the server at {engine.base_url} is gone (process {engine.pid} ended)"
                        if self.session.attached
                        else f"engine exited (code {code}): {reason}"
                    )
                    action = self.verdict("crash", what, {"exit_code": code, "pid": engine.pid})
                    if action != "restart" or not self._restart("crash"):
                        gave_up = action == "restart"
                        break
                    continue
                silent_s = self.probe.silent_s()
                if silent_s >= self.wd.hang_s:
                    status = _proc_status(self.session.pid)
                    action = self.verdict(
                        "hang",
                        f"no answer for {silent_s:.0f} s (process {status})",
                        {
                            "silent_s": round(silent_s, 1),
                            "process_status": status,
                            "pid": self.session.pid,
                        },
                    )
                    if action != "restart" or not self._restart("hang"):
                        gave_up = action == "restart"
                        break
                    continue
                self._consume(time.time())
                if self.canary is not None and self.outcome.stop is None:
                    done, div = self.canary.poll()
                    if done:
                        self._canary_round(div)
        finally:
            self.probe.stop()
            if self.canary is not None:
                self.canary.close()
            locust.stop(grace_s=15)
            self._consume(time.time(), final=True)
            if self.records_seen == 0 and not gave_up and self.outcome.stop is None:
                # the load itself failed (Locust crashed, or its user raised before recording anything)
                logs = sorted((self.run_dir / "logs").glob(f"locust-{self.slice_id}-*.log"))
                tail = logs[0].read_text(errors="replace").strip().splitlines()[-3:] if logs else []
                self.verdict(
                    "no_load",
                    f"Locust sent no request in {time.time() - t_load:.0f} s (exit {locust.returncode()})",
                    {"locust_exit": locust.returncode(), "log_tail": tail},
                )
            elapsed = time.time() - t_load  # soak time is load time, not engine start-up
            stats = locust.stats_total()
            slices.write(
                {
                    "event": "end",
                    "slice": self.slice_id,
                    "config": self.cfg.name,
                    "t_unix": time.time(),
                    "elapsed_s": elapsed,
                    "restarts": self.restarts,
                    "locust_stats": stats,
                    "record_files": [p.name for p in locust.record_files()],
                    # remote workers: each one's share, clock offset, records and failures (harness/load/workers.py)
                    "workers": self.remote_summary(),
                    "stopped_by": self.outcome.why,
                    "engine_uptime_s": self.session.uptime_s(),
                }
            )
            slices.close()
            self.verdicts.close()
            self.windows.close()
            self._compact(locust.record_files())
        return SliceResult(elapsed, self.restarts, self.verdict_count, gave_up, self.outcome)

    @staticmethod
    def _compact(files: list[Path]) -> None:
        """The slice's records as Parquet too, now that no one appends to them: the report only reads."""
        from harness.records.columnar import compact_files

        with contextlib.suppress(OSError):  # the report compacts what is missing
            compact_files(files)

    def _ask_health(self, timeout_s: float) -> bool:
        """One health probe of the session's engine as it is now (a restart replaces it)."""
        engine = self.session.engine
        status, _ = engine.http_get(engine.health_path, timeout=timeout_s)
        return status == 200

    def _locust_config(self) -> dict[str, Any]:
        from harness.load.shapes import load_trace
        from harness.prompts import load_prompts

        sc = self.ctx.sc
        prompts = load_prompts(self.soak.prompts or "builtin:soak", self.ctx.loaded.path.parent)
        if (
            self.soak.lengths is not None
        ):  # prompts at drawn lengths: built once per run and target (harness/prompts/lengths.py)
            prompts = soak_prompts(
                self.run_dir, self.cfg.model or sc.server.model, self.soak, prompts, self.session.engine
            )
        trace = []
        if self.soak.shape.trace:
            path = Path(self.soak.shape.trace)
            trace = load_trace(path if path.is_absolute() else self.ctx.loaded.path.parent / path)
        engine = self.session.engine
        params = self.ctx.params
        return {
            "url": engine.request_url,
            "chat_path": engine.chat_path,
            "engine": engine.name,
            "extras": engine.request_extras(),
            "params": {
                "max_tokens": self.soak.max_tokens or sc.measurement.max_tokens,
                "temperature": params.temperature,
                "seed": params.seed,
                "ignore_eos": True,
                "timeout_s": params.timeout_s,
                "stall_s": self.soak.stall_s,
                "keep_text": True,
            },
            "prompts": [p.to_dict() for p in prompts],
            "prompt_reuse": self.soak.prompt_reuse,
            "prompt_start": self._prompt_start(prompts),
            "shape": self.soak.shape.model_dump(),
            "arrival": self.soak.arrival.model_dump() if self.soak.arrival is not None else None,
            "duration_s": self.soak.duration_s,
            "offset_s": self.offset_s,
            "slice_s": self.slice_s,
            "slice_id": self.slice_id,
            "records_dir": str(self.run_dir / SOAK_DIR),
            "config": self.cfg.name,
            "trace": trace,
        }

    def _prompt_start(self, prompts: list[Any]) -> int:
        """Where this slice starts in the prompt list: past every prompt an earlier slice of this configuration
        began (a slice is a fresh Locust process; starting at 0 again would send those prompts twice)."""
        index = {p.id: i for i, p in enumerate(prompts)}
        used = -1
        for f in sorted((self.run_dir / SOAK_DIR).glob("*.jsonl")):
            for r in read_jsonl(f):
                if r.get("config") == self.cfg.name and not r.get("turn"):
                    used = max(used, index.get(str(r.get("prompt_id")), -1))
        return used + 1

    # ---- windows: change detection, memory headroom, error rate, drift ------------------
    # ---- remote Locust workers (soak.remote_workers): joined, lost ---------------------
    def _remote_events(self) -> None:
        """What the master wrote of its remote workers: a join said on the console, a loss a ``worker_lost`` verdict
        (its arrivals from then on leave the schedule: the offered rate counts only what some worker will send)."""
        if self.soak.remote_workers is None:
            return
        path = self.run_dir / SOAK_DIR / "workers" / f"{self.slice_id}.jsonl"
        for ev in self.worker_tail.read([path]):
            kind = ev.get("event")
            if kind == "summary":
                self.worker_summary = list(ev.get("workers") or [])
                continue
            if kind not in ("joined", "lost"):
                continue
            self.remote_workers[str(ev.get("client_id"))] = ev
            who = f"worker {ev.get('index')} on {ev.get('host')} (pid {ev.get('pid')})"
            if kind == "joined":
                self.ctx.console.print(
                    f"  locust {who} joined: clock {float(ev.get('clock_offset_s') or 0) * 1e3:+.1f} ms from the "
                    f"master's, round trip {float(ev.get('rtt_s') or 0) * 1e3:.1f} ms",
                    highlight=False,
                )
                continue
            self._worker_lost(ev, who)

    def _worker_lost(self, ev: dict[str, Any], who: str) -> None:
        assert self.soak.remote_workers is not None
        # from its last message on, nothing it sent is known to the harness: its share from then on is unsent
        at_s = self._soak_time(float(ev.get("last_seen_unix") or ev["t_unix"]))
        total = self.soak.remote_workers.count
        unsent: int | None = None
        index = int(ev.get("index") or 0)
        if self.arrival is not None and index >= total:
            unsent = 0  # a worker that joined after the load started (index past count) was given no share
        elif self.arrival is not None:
            mask = lost_arrivals(self.schedule_full, index, total, at_s)
            self.schedule_lost |= mask
            self.schedule = self.schedule_full[~self.schedule_lost]
            unsent = int(mask.sum())
        sent, scheduled = int(ev.get("sent") or 0), ev.get("scheduled")
        left = (
            f"; {unsent} of its {scheduled} scheduled arrivals will not be sent (the offered rate leaves them out)"
            if unsent is not None
            else "; its users are not replaced"
        )
        self.verdict(
            "worker_lost",
            f"Locust {who} silent since soak t={at_s:.0f} s, after {sent} requests ({int(ev.get('failed') or 0)} failed){left}",
            {
                **{k: ev.get(k) for k in ("client_id", "index", "host", "pid", "sent", "failed", "scheduled")},
                "lost_unix": ev.get("t_unix"),
                "soak_t_s": round(at_s, 3),
                "unsent": unsent,
            },
        )

    def remote_summary(self) -> list[dict[str, Any]] | None:
        """Each remote worker's share, clock offset, records and failures (the master's summary; else what was seen)."""
        if self.soak.remote_workers is None:
            return None
        self._remote_events()
        return self.worker_summary or list(self.remote_workers.values())

    def _consume(self, now: float, final: bool = False) -> None:
        self._remote_events()
        new = self.tail.read(sorted((self.run_dir / SOAK_DIR).glob(f"{self.slice_id}-*.jsonl")))
        self.records_seen += len(new)
        for r in new:
            if self.ctx.obs.listening:  # typed only for a listener: a soak reads ~1M of them
                with contextlib.suppress(TypeError):  # a line without a request's fields reaches no observer
                    self.ctx.obs.on_request(RequestRecord.from_dict(r))
            bisect.insort(self.ends, end_unix(r))
            start = float(r.get("start_unix_s") or 0.0)
            self.intervals.append((start, end_unix(r)))
            self.longest_s = max(self.longest_s, end_unix(r) - start)
            if (span := span_of(r)) is not None:
                self.spans.append(span)
            if (ask := ask_of(r)) is not None:
                bisect.insort(self.asks, ask, key=lambda a: a.start)
        self.window.extend(new)
        self.unassigned.extend(new)
        if now - self.window_t0 >= self.wd.window_s or (final and self.window):
            self._close_window(now)
        if final:
            self._settle(final=True)

    def _users(self, t_unix: float) -> int:
        return users_at(self.soak.shape.model_dump(), self.offset_s + t_unix - self.t_load, self.soak.duration_s)

    def _soak_time(self, t_unix: float) -> float:
        """Seconds into the soak at ``t_unix``: from the pacing user's start when Locust has said it (open loop), else
        from the start of the load."""
        if self.arrival is not None and self.pacing_t0 is None:
            starts = []
            for f in (self.run_dir / SOAK_DIR).glob(f"{self.slice_id}-*.pacing.json"):
                try:
                    starts.append(float(json.loads(f.read_text())["t0_unix"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            self.pacing_t0 = min(starts) if starts else None
        return self.offset_s + t_unix - (self.pacing_t0 if self.pacing_t0 is not None else self.t_load)

    def _traffic(self, recs: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
        """A window's traffic figures (harness/load/pacing.py ``window_traffic``)."""
        slo = self.ctx.sc.slo
        bounds = (slo.per_stream_tps_min, slo.ttft_p95_s_max, slo.e2e_s_max) if slo is not None else (None, None, None)
        if self.arrival is None:
            return window_traffic(recs, t1 - t0, bounds)
        # the window in soak seconds, within the slice's schedule (Locust's start-up before it, the drain after it ask nothing)
        s0, s1 = self._soak_time(t0), self._soak_time(t1)
        span = (max(s0, self.offset_s), min(s1, self.offset_s + self.slice_s))
        return window_traffic(recs, t1 - t0, bounds, self.arrival, self.schedule, span, self.soak.duration_s)

    def _close_window(self, now: float) -> None:
        """The window's live figures (engine counters, memory, CPU) at its end; its request figures wait until it settles."""
        counters = self._scrape()
        pid = self.session.pid
        users_start, users_end = self._users(self.window_t0), self._users(now)
        memory = memory_figures(tree_memory(pid), self._cache_state())
        harness_rss = (rss_bytes(os.getpid()) or 0) + sum(tree_rss_bytes(p) for p in self.locust_pids)
        available = psutil.virtual_memory().available
        gpu = self.ctx.gpu_sample(pid)
        cpu = (
            self.cpu_meter.stop() if self.cpu_meter is not None else None
        )  # then at once the next window's meter, below
        win = live_window(
            config=self.cfg.name,
            slice_id=self.slice_id,
            t0=self.window_t0,
            t1=now,
            delta=window_delta(self.window_counters, counters),
            memory=memory,
            probe_latencies_s=self.probe.take(),
            # the load level: Locust users (None: it changed inside the window); open loop: no users, the rate's level
            users=(users_start if users_start == users_end else None) if self.arrival is None else None,
            engine_pid=pid,
            engine_uptime_s=self.session.uptime_s(now),
            engine_restart=self.engine_restarted,
            harness_rss_mib=harness_rss / 2**20,
            machine_memory_available_mib=available / 2**20,
            gpu=gpu,
            cpu=cpu,
            cpu_engine_restarted=self.cpu_meter is not None and pid != self.cpu_meter.engine_pid,
            contamination_cores=self.ctx.sc.measurement.contamination_cores,
        )
        self.engine_restarted = False
        if self.cpu_meter is not None:
            self.cpu_meter = CpuMeter(pid, client_pids=self.locust_pids).start()
        self.window, self.window_t0, self.window_counters = [], now, counters
        self.pending.append((win, counters))
        self._settle()

    def _settle(self, final: bool = False) -> None:
        """Judge the windows whose requests have ended: all but the last SETTLE_WINDOWS closed, or all at the end."""
        while self.pending and (final or len(self.pending) > SETTLE_WINDOWS):
            win, counters = self.pending.pop(0)
            self._judge(self._request_figures(win, counters, last=final and not self.pending))

    def _request_figures(
        self, win: dict[str, Any], counters: EngineCounters | None, last: bool = False
    ) -> dict[str, Any]:
        """The window's request figures (harness/soak/assemble.py ``settle_window``): the requests that ended in it (a record
        that arrived after its window was judged joins the next; the slice's last window takes all left), the tokens
        streamed inside it, the work done since the engine started (``counters``: its totals at the window's end)."""
        t0, t1 = win["t_start_unix"], win["t_end_unix"]
        ended, self.unassigned = take_ended(self.unassigned, t1, last)
        # a request that ends in this window or later started after t0 - longest_s; what ended before it is not needed
        self.intervals = [iv for iv in self.intervals if iv[1] >= t0 - 2 * self.longest_s]
        self.spans = [sp for sp in self.spans if sp.end >= t0 - 2 * self.longest_s]
        self.asks = [a for a in self.asks if a.end >= t0 - 2 * self.longest_s]
        earlier = self.history.get(self.cfg.name)
        previous = earlier[-1] if earlier else None
        backlog = None
        if self.arrival is not None:
            soak_t1 = min(self._soak_time(t1), self.offset_s + self.slice_s)
            backlog = outstanding(self.schedule, self.offset_s, soak_t1, self.ends, t1)
        return settle_window(
            win,
            ended,
            self.unassigned,
            previous,
            counters,
            self._traffic(ended, t0, t1),
            self.arrival is not None,
            backlog,
            self.backlog,
            self.intervals,
            self.probe.pauses(self.wd.stall_warn_s),
            self.spans,
            self.speed,
            self.wd.reference_windows,
            self.detector.warming_up() or bool(win.get("engine_restart")),
            asks=self.asks,
            prefill=self.prefill,
        )

    def _judge(self, win: dict[str, Any]) -> None:
        """Feed the detector, write the window, give the verdicts of the watchdog's rules (harness/soak/watchdog.py)."""
        if win.get("engine_restart"):
            self.detector.engine_restarted()  # as replay_detector does: the same windows give the same detector
        events = self.detector.update(win)
        judged, why = self.detector.judged()
        history = self.history.get(self.cfg.name, [])
        window = judged_window(
            win,
            judged,
            why,
            detector_states(self.detector),
            headroom(history, win, self.wd),
            headroom(history, win, self.wd, gpu=True),
        )
        record = window.to_dict()
        self.windows.write(record)
        self.ctx.obs.on_window(window)
        self.history.setdefault(self.cfg.name, []).append(record)
        self.backlog.add(record)
        self._status_line(record, window.t_end_unix)
        disk_short = self.disk.check(window.t_end_unix)
        for f in judge(
            window, self.history[self.cfg.name], self.wd, self.state, events, disk_short, self.arrival is not None
        ):
            self.verdict(f.kind, f.message, f.evidence, metric=f.metric, action=f.action)

    def _cache_state(self) -> Any:
        """The prompt cache's newest logged size (kept from an earlier window when nothing new was logged)."""
        engine = self.session.engine
        text = self.log_follower.read(engine.spec.attach_log if engine.spec.attached else engine.log_path)
        state = engine.cache_state(text) if text else None
        if state is not None:
            self.cache_seen = state
        return self.cache_seen

    def _status_line(self, win: dict[str, Any], now: float) -> None:
        done = self.offset_s + (now - self.t_load)
        self.ctx.console.print(
            f"  soak {self.cfg.name} {done:,.0f}/{self.soak.duration_s:,.0f} s, engine up {_hours(win['engine_uptime_s'])}: "
            f"{win['requests']} requests, {win['errors']} failed, {win['output_tps']:.1f} t/s out"
            + (f", decode {win['decode_tps']:.1f} t/s" if win["decode_tps"] else "")
            + (f", TTFT p95 {win['ttft_p95_s']:.2f} s" if win["ttft_p95_s"] is not None else "")
            + (f", acceptance {win['acceptance']:.2f}" if win["acceptance"] is not None else "")
            + (f", engine RSS {win['engine_rss_mib']:.0f} MiB" if win["engine_rss_mib"] else "")
            + (f" (prompt cache {win['prompt_cache_mib']:.0f} MiB)" if win.get("prompt_cache_mib") else "")
            + (f", longest stall {stall:.1f} s" if (stall := longest_stall(win)) is not None and stall >= 1.0 else "")
            + (
                f", offered {win['offered_rps']:.2f} rps, achieved {win['achieved_rps']:.2f}, late {win['late']}"
                if win.get("offered_rps") is not None
                else ""
            )
            + (f", goodput {win['goodput_rps']:.2f} rps" if win.get("goodput_rps") is not None else "")
            + (f" [dim](not judged: {win['not_judged_why']})[/]" if not win["judged"] else ""),
            highlight=False,
        )


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _uptime_s(pid: int | None, now: float) -> float | None:
    try:
        return now - psutil.Process(pid).create_time() if pid else None
    except psutil.Error:
        return None


def _proc_status(pid: int | None) -> str:
    try:
        return psutil.Process(pid).status() if pid else "gone"
    except psutil.Error:
        return "gone"


def load_history(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    hist: dict[str, list[dict[str, Any]]] = {}
    for w in read_jsonl(run_dir / WINDOWS):
        hist.setdefault(w["config"], []).append(w)
    return hist
