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
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from engines.base import EngineCounters, acceptance_figures, counters_delta
from harness.soak import canary as canary_mod
from harness.detect.changepoint import ChangeDetector, ChangeEvent, DetectorSettings, memory_forecast
from harness.probe.cpu import CpuMeter, tree_memory, tree_rss_bytes
from harness.soak.disk import DiskWatch
from harness.common.errors import EngineError
from harness.soak.explain import explain
from harness.load.locust_proc import LocustProcess
from harness.load.pacing import window_traffic
from harness.load.schedule import LEVEL_STEP, soak_offsets
from harness.load.shapes import users_at
from harness.prompts.lengths import soak_prompts
from harness.records.files import SLICES, SOAK_DIR, VERDICTS, WINDOWS, JsonlWriter, read_jsonl
from harness.config.policy import FAILURE_KINDS
from harness.config.schema import Configuration, Soak, Watchdog
from harness.session.engine import EngineSession, RunContext
from harness.soak.figures import (cache_outlook, engine_view, longest_stall, memory_figures, stall_figures, stall_to_flag,
                                  work_done)
from harness.detect.trend import WATCHED, trend
from harness.soak.windows import acceptance_sd, end_unix, load_key, load_state, outstanding, take_ended, window_figures

OBSERVED_FAILURES = (*FAILURE_KINDS, "error_rate", "no_load", "stall", "disk")
EXPLAINED = ("collapse", "stall", "divergence", "memory")  # verdicts whose evidence lists the series that moved with them
RSS_TREND_AFTER_S = 600.0  # the slow RSS trend ignores the engine's first 10 minutes (warm-up growth is not a leak)
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


class RecordTail:
    """Reads the complete new lines of growing JSONL files."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = defaultdict(int)

    def read(self, files: list[Path]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in files:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.offsets[path] += end + 1
            for line in data[: end + 1].splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


class LogFollower:
    """The engine log's new text since the last read (a log that shrank was replaced: read it from its start), so a
    running-state line is found however many lines the engine wrote after it."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0

    def read(self, path: Path | None, max_bytes: int = 64 * 2**20) -> str:
        if path is None:
            return ""
        if path != self.path:
            self.path, self.offset = path, 0
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                if end < self.offset:
                    self.offset = 0
                f.seek(max(self.offset, end - max_bytes))
                data = f.read(end - f.tell())
        except OSError:
            return ""
        self.offset = end
        return data.decode("utf-8", "replace")


def detector_settings(wd: Watchdog) -> DetectorSettings:
    return DetectorSettings(warmup_windows=wd.warmup_windows, reference_windows=wd.reference_windows, confirm_windows=wd.confirm_windows)


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

    def __init__(self, ctx: RunContext, cfg: Configuration, session: EngineSession, slice_id: str, slice_s: float, offset_s: float,
                 history: dict[str, list[dict[str, Any]]], detector: ChangeDetector):
        self.ctx = ctx
        self.cfg = cfg
        self.session = session
        self.soak: Soak = ctx.sc.soak  # type: ignore[assignment]
        self.wd = self.soak.watchdog
        self.slice_id = slice_id
        self.slice_s = slice_s
        self.offset_s = offset_s
        self.run_dir: Path = ctx.run_dir
        self.history = history  # config -> windows so far (drift needs the whole soak)
        self.detector = detector
        self.restarts = 0
        self.verdict_count = 0
        self.outcome = SliceOutcome()
        self.flagged: set[str] = {v["metric"] for v in read_jsonl(self.run_dir / VERDICTS) if v.get("config") == cfg.name and v.get("kind") == "drift"}
        self.memory_warned_pid: int | None = None
        self.gpu_warned_pid: int | None = None
        self.disk = DiskWatch(self.run_dir, self.wd)  # the results disk's free space, once a window (harness/soak/disk.py)
        self.cache_warned_pid: int | None = None
        self.log_follower = LogFollower()
        self.cache_seen: Any = None  # the prompt cache as the engine last logged it
        self.probe_latencies: list[float] = []  # health probes of the open window, seconds (a timeout counts as its limit)
        self.stall_flagged_s = 0.0  # the longest stall a verdict has named on this engine
        self.tail = RecordTail()
        self.records_seen = 0
        self.window: list[dict[str, Any]] = []
        # closed windows (and the engine counters at their end) waiting SETTLE_WINDOWS for their requests to end
        self.pending: list[tuple[dict[str, Any], EngineCounters | None]] = []
        self.unassigned: list[dict[str, Any]] = []  # records not yet given to a window (by end time), or still streaming
        self.ends: list[float] = []  # end times of the slice's records, ascending (the open-loop backlog)
        self.slice_windows: list[dict[str, Any]] = []  # this slice's judged windows (the backlog's history)
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
        self.schedule = (soak_offsets(self.arrival, offset_s, offset_s + slice_s, self.soak.duration_s)
                         if self.arrival is not None else np.zeros(0))
        self.pacing_t0: float | None = None
        self.canary: canary_mod.Canary | None = None

    # ---- verdicts --------------------------------------------------------------------
    def verdict(self, kind: str, message: str, evidence: dict[str, Any], metric: str | None = None, action: str | None = None) -> str:
        """Write a verdict, tell the observers, and return the action to take (the scenario's, unless given)."""
        action = action or self.wd.action(kind)
        if kind in EXPLAINED:
            onset = float(evidence.get("onset_unix") or (self.history.get(self.cfg.name) or [{}])[-1].get("t_start_unix") or time.time())
            why = explain(self.history.get(self.cfg.name, []), onset, metric or kind)
            evidence = {**evidence, "explanation": why.to_dict()}
            message = f"{message}; {why.text()}"
        if action == "restart" and self.session.attached:
            action = "stop_config"  # an attached server is not specsoak's to restart: its soak ends, the verdict stays
            message = f"attached server: {message}"
        now = time.time()
        rec = {"t_unix": now, "config": self.cfg.name, "slice": self.slice_id, "kind": kind, "metric": metric,
               "message": message, "evidence": evidence, "action": action, "engine_uptime_s": self.session.uptime_s(now),
               "engine_pid": self.session.pid}
        self.verdicts.write(rec)
        self.verdict_count += 1
        self.ctx.obs.on_verdict(rec)
        if kind in OBSERVED_FAILURES:
            self.ctx.obs.on_failure({**rec, "stage": "soak", "unix_s": now})
        up = rec["engine_uptime_s"]
        colour = "red" if kind in FAILURE_KINDS else "yellow"
        self.ctx.console.print(f"  [{colour}]watchdog: {kind}{f' ({metric})' if metric else ''} at engine uptime "
                               f"{_hours(up)}: {message} -> {action}[/]", highlight=False)
        if action in ("stop_config", "stop_run") and self.outcome.stop is None:
            self.outcome = SliceOutcome("config" if action == "stop_config" else "run", f"{kind}{f' ({metric})' if metric else ''}: {message}")
        return action

    def _canary_round(self, div: canary_mod.Divergence | None) -> None:
        """A finished canary round: to the observers, its errors said, and a divergence judged by the rule a verdict."""
        assert self.canary is not None
        summary = self.canary.summary()
        self.ctx.obs.on_canary(summary)
        if summary["errors"]:
            self.ctx.console.print(f"  [yellow]canary: {summary['errors']} of {summary['answers']} answers failed: {summary['error']}[/]", highlight=False)
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
                self.verdict("gave_up", f"{self.restarts} restarts already; the configuration's soak ends", {"restarts": self.restarts}, action="stop_config")
                return False
            self.restarts += 1
            try:
                self.session.restart(kill=kill)
            except EngineError as exc:
                self.verdict("restart_failed", str(exc), {"after": why, "restarts": self.restarts}, action="retry")
                kill = True
                continue
            self.window_counters = self._scrape()
            self.engine_restarted = True  # the next window says so; the detector's warm-up starts there, as in a replay
            self.memory_warned_pid = None
            self.gpu_warned_pid = None
            self.cache_warned_pid = None
            self.cache_seen = None
            self.stall_flagged_s = 0.0
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
        slices.write({"event": "start", "slice": self.slice_id, "config": self.cfg.name, "t_unix": t_start, "offset_s": self.offset_s,
                      "slice_s": self.slice_s, "engine_pid": self.session.pid, "engine_started_unix": self.session.started_unix})
        self.engine_restarted = True  # warm-up: a new engine, or the first windows of a resumed soak (the first window says so)
        key = self.session.engine.spec.api_key
        locust = LocustProcess(self._locust_config(), self.run_dir / SOAK_DIR, self.run_dir / "logs", self.soak.workers,
                               secret_env={"SPECSOAK_LOCUST_API_KEY": key} if key else None)
        gave_up = False
        t_load = self.t_load = time.time()
        try:
            self.canary = canary_mod.for_slice(self.ctx, self.cfg, self.session, self.slice_id)
            if self.canary is not None:  # its first round before the traffic (the reference is the engine's answer alone) and the first window
                self._canary_round(self.canary.first_round())
            self.window_t0 = time.time()
            self.window_counters = self._scrape()
            last_ok = time.monotonic()
            t_load = self.t_load = time.time()
            locust.start()
            self.locust_pids = tuple(locust.pids)
            self.cpu_meter = CpuMeter(self.session.pid, client_pids=self.locust_pids).start()
            hard_stop = time.monotonic() + self.slice_s + 120
            while locust.alive() and time.monotonic() < hard_stop and self.outcome.stop is None:
                time.sleep(self.wd.probe_interval_s)
                if not self.session.alive():
                    engine = self.session.engine
                    code = engine.proc.returncode if engine.proc else None
                    reason = engine.failure_reason(engine.read_log()) or "no reason in its log"
                    what = (f"the server at {engine.base_url} is gone (process {engine.pid} ended)" if self.session.attached
                            else f"engine exited (code {code}): {reason}")
                    action = self.verdict("crash", what, {"exit_code": code, "pid": engine.pid})
                    if action != "restart" or not self._restart("crash"):
                        gave_up = action == "restart"
                        break
                    last_ok = time.monotonic()
                    continue
                if self._healthy():
                    # the stretch without a healthy answer, less the probe's own pause: a pause longer than a probe's timeout
                    self.probe_latencies.append(max(0.0, time.monotonic() - last_ok - self.wd.probe_interval_s))
                    last_ok = time.monotonic()
                elif time.monotonic() - last_ok >= self.wd.hang_s:
                    status = _proc_status(self.session.pid)
                    action = self.verdict("hang", f"no answer for {time.monotonic() - last_ok:.0f} s (process {status})",
                                          {"silent_s": round(time.monotonic() - last_ok, 1), "process_status": status, "pid": self.session.pid})
                    if action != "restart" or not self._restart("hang"):
                        gave_up = action == "restart"
                        break
                    last_ok = time.monotonic()
                    continue
                self._consume(time.time())
                if self.canary is not None and self.outcome.stop is None:
                    done, div = self.canary.poll()
                    if done:
                        self._canary_round(div)
        finally:
            if self.canary is not None:
                self.canary.close()
            locust.stop(grace_s=15)
            self._consume(time.time(), final=True)
            if self.records_seen == 0 and not gave_up and self.outcome.stop is None:
                # the load itself failed (Locust crashed, or its user raised before recording anything)
                logs = sorted((self.run_dir / "logs").glob(f"locust-{self.slice_id}-*.log"))
                tail = logs[0].read_text(errors="replace").strip().splitlines()[-3:] if logs else []
                self.verdict("no_load", f"Locust sent no request in {time.time() - t_load:.0f} s (exit {locust.returncode()})",
                             {"locust_exit": locust.returncode(), "log_tail": tail})
            elapsed = time.time() - t_load  # soak time is load time, not engine start-up
            stats = locust.stats_total()
            slices.write({"event": "end", "slice": self.slice_id, "config": self.cfg.name, "t_unix": time.time(), "elapsed_s": elapsed,
                          "restarts": self.restarts, "locust_stats": stats, "record_files": [p.name for p in locust.record_files()],
                          "stopped_by": self.outcome.why, "engine_uptime_s": self.session.uptime_s()})
            slices.close()
            self.verdicts.close()
            self.windows.close()
            self._compact(locust.record_files())
        return SliceResult(elapsed, self.restarts, self.verdict_count, gave_up, self.outcome)

    @staticmethod
    def _compact(files: list[Path]) -> None:
        """The slice's records as Parquet too, now that no one appends to them: the report only reads."""
        from harness.records.columnar import compact_files

        try:
            compact_files(files)
        except OSError:
            pass  # the report compacts what is missing

    def _healthy(self) -> bool:
        timeout = min(5.0, max(0.5, self.wd.hang_s / 3))
        t0 = time.perf_counter()
        try:
            status, _ = self.session.engine.http_get(self.session.engine.health_path, timeout=timeout)
            return status == 200
        except OSError:
            return False
        finally:
            self.probe_latencies.append(min(timeout, time.perf_counter() - t0))

    def _locust_config(self) -> dict[str, Any]:
        from harness.load.shapes import load_trace
        from harness.prompts import load_prompts

        sc = self.ctx.sc
        prompts = load_prompts(self.soak.prompts or "builtin:soak", self.ctx.loaded.path.parent)
        if self.soak.lengths is not None:  # prompts at drawn lengths: built once per run and target (harness/prompts/lengths.py)
            prompts = soak_prompts(self.run_dir, self.cfg.model or sc.server.model, self.soak, prompts, self.session.engine)
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
            "params": {"max_tokens": self.soak.max_tokens or sc.measurement.max_tokens, "temperature": params.temperature,
                       "seed": params.seed, "ignore_eos": True, "timeout_s": params.timeout_s, "stall_s": self.soak.stall_s, "keep_text": True},
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
    def _consume(self, now: float, final: bool = False) -> None:
        new = self.tail.read(sorted((self.run_dir / SOAK_DIR).glob(f"{self.slice_id}-*.jsonl")))
        self.records_seen += len(new)
        for r in new:
            self.ctx.obs.on_request(r)
            bisect.insort(self.ends, end_unix(r))
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
        delta: EngineCounters | None = None
        if counters is not None and self.window_counters is not None:
            delta = counters_delta(self.window_counters, counters)
            if (delta.draft_tokens or 0) < 0 or (delta.accepted_tokens or 0) < 0 or (delta.output_tokens or 0) < 0:
                delta = counters  # the engine restarted inside the window: its counters began again
        acc = acceptance_figures(delta) if delta is not None else {"acceptance": None, "mean_accept_len": None}
        users_start, users_end = self._users(self.window_t0), self._users(now)
        pid = self.session.pid
        memory = memory_figures(tree_memory(pid), self._cache_state())
        win: dict[str, Any] = {
            "config": self.cfg.name, "slice": self.slice_id, "t_start_unix": self.window_t0, "t_end_unix": now,
            "t_unix": (self.window_t0 + now) / 2,
            "acceptance": acc["acceptance"], "mean_accept_len": acc["mean_accept_len"],
            "counters": delta.to_dict() if delta is not None else None,
            **memory,
            "probe_max_s": max(self.probe_latencies) if self.probe_latencies else None,
            **engine_view(delta),
            # the load level: Locust users (None: it changed inside the window); open loop: no users, the rate's level
            "users": (users_start if users_start == users_end else None) if self.arrival is None else None,
            "engine_pid": pid,
            "engine_uptime_s": self.session.uptime_s(now),
            "engine_restart": self.engine_restarted,
            "harness_rss_mib": (psutil.Process(os.getpid()).memory_info().rss + sum(tree_rss_bytes(p) for p in self.locust_pids)) / 2**20,
            "machine_memory_available_mib": psutil.virtual_memory().available / 2**20,
        }
        gpu = self.ctx.gpu_sample(pid)
        win["gpu"] = gpu
        win["gpu_used_mib"] = gpu["used_bytes"] / 2**20 if gpu.get("used_bytes") is not None else None
        win["gpu_total_mib"] = gpu["total_bytes"] / 2**20 if gpu.get("total_bytes") is not None else None
        win["engine_gpu_mib"] = gpu["process_bytes"] / 2**20 if gpu.get("process_bytes") is not None else None
        self.engine_restarted = False
        if self.cpu_meter is not None:
            cpu = self.cpu_meter.stop()
            win["cpu"] = {**cpu.to_dict(), "engine_restarted": pid != self.cpu_meter.engine_pid}
            win["engine_cores"] = cpu.engine_cores
            win["contaminated"] = cpu.other_cores > self.ctx.sc.measurement.contamination_cores
            self.cpu_meter = CpuMeter(pid, client_pids=self.locust_pids).start()
        else:
            win["contaminated"] = False
        self.window, self.window_t0, self.window_counters = [], now, counters
        self.probe_latencies = []
        self.pending.append((win, counters))
        self._settle()

    def _settle(self, final: bool = False) -> None:
        """Judge the windows whose requests have ended: all but the last SETTLE_WINDOWS closed, or all at the end."""
        while self.pending and (final or len(self.pending) > SETTLE_WINDOWS):
            win, counters = self.pending.pop(0)
            self._judge(self._request_figures(win, counters, last=final and not self.pending))

    def _request_figures(self, win: dict[str, Any], counters: EngineCounters | None, last: bool = False) -> dict[str, Any]:
        """The window's request figures (harness/soak/windows.py): tokens streamed inside it, and the requests that ended in
        it (a record that arrived after its window was judged joins the next; the slice's last window takes all left);
        their longest chunk gaps, and the work done since the engine started (``counters``: its totals at the window's end)."""
        t0, t1 = win["t_start_unix"], win["t_end_unix"]
        ended, self.unassigned = take_ended(self.unassigned, t1, last)
        chunks = stall_figures(ended, [])
        win["max_chunk_gap_s"], win["itl_p99_s"] = chunks["max_chunk_gap_s"], chunks["itl_p99_s"]
        previous = (self.history.get(self.cfg.name) or [None])[-1]
        win.update(work_done(previous, ended, counters, restarted=bool(win.get("engine_restart")) or previous is None
                             or previous.get("engine_pid") != win.get("engine_pid")))
        win.update(window_figures(ended, ended + self.unassigned, t0, t1, self.arrival is not None, win.get("users")))
        win["count_sd"]["acceptance"] = acceptance_sd(win.get("acceptance"), (win.get("counters") or {}).get("draft_tokens"))
        win.update(self._traffic(ended, t0, t1))
        if self.arrival is not None:
            soak_t1 = min(self._soak_time(t1), self.offset_s + self.slice_s)
            win["outstanding_end"] = outstanding(self.schedule, self.offset_s, soak_t1, self.ends, t1)
            win.update(load_state(self.slice_windows, win))
        return win

    def _judge(self, win: dict[str, Any]) -> None:
        """Feed the detector, write the window, give its verdicts."""
        recs_n, errors = win["requests"], win["errors"]
        now = win["t_end_unix"]
        pid = win["engine_pid"]
        if win.get("engine_restart"):
            self.detector.engine_restarted()  # as replay_detector does: the same windows give the same detector
        events = self.detector.update(win)
        judged, why = self.detector.judged()
        win["judged"], win["not_judged_why"] = judged, why
        win["detectors"] = {m: asdict(st) for m, st in self.detector.state().items()}
        win["memory_headroom_s"], win["memory_slope_mib_per_h"] = self._headroom(win)
        win["gpu_headroom_s"], win["gpu_slope_mib_per_h"] = self._headroom(win, gpu=True)
        self.windows.write(win)
        self.ctx.obs.on_window(win)
        self.history.setdefault(self.cfg.name, []).append(win)
        self.slice_windows.append(win)
        self._status_line(win, now)
        for ev in events:
            self._change_verdict(ev, win)
        self._stall(win)
        self._cache(win)
        if win["memory_headroom_s"] is not None and win["memory_headroom_s"] < self.wd.memory_horizon_s and self.memory_warned_pid != pid:
            self.memory_warned_pid = pid
            self.verdict("memory", f"at the engine's memory slope ({win['memory_slope_mib_per_h']:+,.0f} MiB/h, prompt cache left out), "
                         f"available memory ({self._available_mib(win):,.0f} MiB) runs out in {win['memory_headroom_s'] / 60:.0f} min",
                         {"window": _brief(win), "headroom_s": win["memory_headroom_s"]}, metric="engine_memory_mib")
        if win["gpu_headroom_s"] is not None and win["gpu_headroom_s"] < self.wd.memory_horizon_s and self.gpu_warned_pid != pid:
            self.gpu_warned_pid = pid
            self.verdict("memory", f"at the GPU memory slope ({win['gpu_slope_mib_per_h']:,.0f} MiB/h), GPU memory "
                         f"({win['gpu_total_mib'] - win['gpu_used_mib']:,.0f} MiB free) runs out in {win['gpu_headroom_s'] / 60:.0f} min",
                         {"window": _brief(win), "headroom_s": win["gpu_headroom_s"]}, metric="gpu_used_mib")
        if (short := self.disk.check(now)) is not None:
            self.verdict("disk", short[0], {**short[1], "window": _brief(win)})
        if recs_n >= self.wd.min_requests and errors / recs_n >= self.wd.error_rate:
            self.verdict("error_rate", f"{errors} of {recs_n} requests failed in the last window", {"window": _brief(win)})
        self._drift()

    def _headroom(self, win: dict[str, Any], gpu: bool = False) -> tuple[float | None, float | None]:
        """(seconds until available memory runs out at the engine's memory slope over the last memory_fit_s, that slope
        in MiB/h), this engine process only; (None, slope) when it does not grow, (None, None) before there is a forecast.
        ``gpu``: the GPUs' used memory against their free memory instead (None without NVML)."""
        pid = win["engine_pid"]
        key = "gpu_used_mib" if gpu else "engine_memory_mib"
        pts = [(w["t_unix"], w[key]) for w in self.history.get(self.cfg.name, []) + [win]
               if w.get("engine_pid") == pid and w.get(key) is not None and w["t_unix"] >= win["t_unix"] - self.wd.memory_fit_s]
        if len(pts) < 3:
            return None, None
        available = win["gpu_total_mib"] - win["gpu_used_mib"] if gpu else self._available_mib(win)
        fc = memory_forecast([p[0] for p in pts], [p[1] for p in pts], available, min_span_s=min(600.0, self.wd.memory_fit_s / 2))
        return (fc.headroom_s, fc.slope_mib_per_h) if fc is not None else (None, None)

    def _available_mib(self, win: dict[str, Any]) -> float:
        """Memory the engine can still take: the machine's available memory, or less under ``memory_limit_mib``."""
        available = float(win.get("machine_memory_available_mib") or 0.0)
        if self.wd.memory_limit_mib is not None:
            held = max(float(win.get("engine_rss_mib") or 0.0), float(win.get("engine_anon_mib") or 0.0))
            available = min(available, max(0.0, self.wd.memory_limit_mib - held))
        return available

    def _cache_state(self) -> Any:
        """The prompt cache's newest logged size (kept from an earlier window when nothing new was logged)."""
        engine = self.session.engine
        text = self.log_follower.read(engine.spec.attach_log if engine.spec.attached else engine.log_path)
        state = engine.cache_state(text) if text else None
        if state is not None:
            self.cache_seen = state
        return self.cache_seen

    def _stall(self, win: dict[str, Any]) -> None:
        """A ``stall`` verdict when a stream or the health probe waited past ``stall_warn_s``, and again each time the
        longest pause grows by half (pauses that lengthen with uptime: each a line, long before a request fails).
        Contaminated windows are not judged, as in the change detector."""
        if win.get("contaminated"):
            return  # other processes took the CPU: a pause then is the machine's, not the engine's (recorded, not judged)
        stall = stall_to_flag(win, self.wd.stall_warn_s, self.stall_flagged_s)
        if stall is None:
            return
        self.stall_flagged_s = stall
        gap = win.get("max_chunk_gap_s")
        self.verdict("stall", f"the engine did not answer its health probe for {stall:.1f} s (floor {self.wd.stall_warn_s:g} s)"
                     + (f"; longest gap between two chunks of a stream {gap:.1f} s" if isinstance(gap, int | float) else ""),
                     {"window": _brief(win), "longest_stall_s": stall, "onset_unix": win["t_start_unix"]}, metric="longest_stall_s")

    def _cache(self, win: dict[str, Any]) -> None:
        """The prompt cache: growth toward a cap that fits is by design (the report names it); a cap that does not fit
        is a warning once per engine, and a ``memory`` verdict when its growth will use up the memory left."""
        pid = win["engine_pid"]
        pts = [(w["t_unix"], w["prompt_cache_mib"]) for w in self.history.get(self.cfg.name, [])
               if w.get("engine_pid") == pid and w.get("prompt_cache_mib") is not None and w["t_unix"] >= win["t_unix"] - self.wd.memory_fit_s]
        cap = win.get("prompt_cache_cap_mib")
        if not pts:
            return
        available = self._available_mib(win)
        out = cache_outlook(pts, cap, available)
        if out is None or out.fits:
            return
        if self.cache_warned_pid != pid:
            self.cache_warned_pid = pid
            self.verdict("cache_cap", f"the engine's prompt cache may grow to {'no limit' if cap is None or cap < 0 else f'{cap:,.0f} MiB'} "
                         f"({out.size_mib:,.0f} MiB now) but only {available:,.0f} MiB is available", {"window": _brief(win),
                         "cap_mib": cap, "size_mib": out.size_mib, "available_mib": available}, metric="prompt_cache_mib", action="record")
        if out.runs_out_s is not None and out.runs_out_s < self.wd.memory_horizon_s and self.memory_warned_pid != pid:
            self.memory_warned_pid = pid
            self.verdict("memory", f"the prompt cache grows {out.slope_mib_per_h:,.0f} MiB/h toward a cap that does not fit: "
                         f"available memory ({available:,.0f} MiB) runs out in {out.runs_out_s / 60:.0f} min",
                         # the growth's onset: the end of the first window of the fit (what it grew from)
                         {"window": _brief(win), "headroom_s": out.runs_out_s, "cap_mib": cap, "size_mib": out.size_mib,
                          "onset_unix": next(w["t_end_unix"] for w in self.history.get(self.cfg.name, []) if w["t_unix"] == pts[0][0])},
                         metric="prompt_cache_mib")

    def _change_verdict(self, ev: ChangeEvent, win: dict[str, Any]) -> None:
        evidence = {**ev.to_dict(), "windows": [_brief(w) for w in self.history.get(self.cfg.name, [])[-(self.wd.confirm_windows + 2):]]}
        change = f"{ev.relative_change:+.0%}" if ev.metric != "error_ratio" else f"{ev.relative_change:+.2f}"
        if ev.kind == "collapse":
            at = f"{ev.level} users" if self.arrival is None else f"load level {ev.level} (about {LEVEL_STEP ** (ev.level or 0):.3g} rps)"
            self.verdict("collapse", f"{ev.metric} {change} against its reference {ev.reference:.3g} at {at} "
                         f"(now {ev.value:.3g}), since {time.strftime('%H:%M:%S', time.localtime(ev.onset_unix))}", evidence, metric=ev.metric)
        else:
            self.verdict("recovered", f"{ev.metric} back near its reference after {(ev.episode_end_unix or 0) - (ev.episode_start_unix or 0):.0f} s "
                         f"(worst {ev.size:+.2g})", evidence, metric=ev.metric, action="record")

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
            + (f", offered {win['offered_rps']:.2f} rps, achieved {win['achieved_rps']:.2f}, late {win['late']}"
               if win.get("offered_rps") is not None else "")
            + (f", goodput {win['goodput_rps']:.2f} rps" if win.get("goodput_rps") is not None else "")
            + (f" [dim](not judged: {win['not_judged_why']})[/]" if not win["judged"] else ""),
            highlight=False,
        )

    def _drift(self) -> None:
        wins = self.history.get(self.cfg.name, [])
        if len(wins) < self.wd.drift_min_windows:
            return
        for metric, bad in WATCHED.items():
            if metric in self.flagged:
                continue
            pts = drift_points(wins, metric)
            if len(pts) < self.wd.drift_min_windows:
                continue
            tr = trend(metric, [p[0] for p in pts], [p[1] for p in pts], bad, self.wd.drift_alpha, self.wd.drift_min_change,
                       [p[2] for p in pts])
            if tr is not None and tr.drifting:
                self.flagged.add(metric)
                self.verdict("drift", f"{metric} {'rises' if bad > 0 else 'falls'} {abs(tr.relative_change):.0%} over the soak "
                             f"(Theil-Sen {tr.slope_per_hour:+.3g}/h, CI [{tr.slope_low_per_hour:+.3g}, {tr.slope_high_per_hour:+.3g}], p={tr.p_value:.2g})",
                             tr.to_dict(), metric=metric)


def drift_points(wins: list[dict[str, Any]], metric: str) -> list[tuple[float, float, Any]]:
    """(t_unix, value, load level) of the windows the drift test takes: not contaminated, engine memory only after the
    engine's first 10 minutes and at one level (memory does not follow the load), the rest at their load level
    (harness/soak/windows.py ``load_key``), open-loop windows only where the backlog held still."""
    out: list[tuple[float, float, Any]] = []
    for w in wins:
        if w.get(metric) is None or w.get("contaminated"):
            continue
        if metric == "engine_memory_mib":
            if (w.get("engine_uptime_s") or 0) >= RSS_TREND_AFTER_S:
                out.append((w["t_unix"], w[metric], None))
            continue
        level = load_key(w)
        if ("load_level" in w or "users" in w) and level is None or w.get("load_settled") is False:
            continue
        out.append((w["t_unix"], w[metric], level))
    return out


def _brief(w: dict[str, Any]) -> dict[str, Any]:
    """A window as verdict evidence: its figures, without the detector state and CPU detail."""
    keep = ("t_start_unix", "t_end_unix", "requests", "errors", "output_tps", "decode_tps", "ttft_p95_s", "error_ratio",
            "acceptance", "engine_rss_mib", "engine_memory_mib", "engine_anon_mib", "prompt_cache_mib", "users", "engine_uptime_s",
            "contaminated", "achieved_rps", "goodput_rps", "offered_rps", "late", "load_level", "max_chunk_gap_s", "probe_max_s",
            "requests_waiting", "kv_usage", "prefix_hit_rate", "engine_requests_done", "engine_output_tokens_done", "outstanding_end",
            "draining", "load_settled")
    return {k: w.get(k) for k in keep}


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
