"""The soak: hours of Locust traffic against one engine per slice, under a watchdog.

Watchdog verdicts, each written with its time and evidence to ``verdicts.jsonl``:

- ``crash``: the engine process exited -> restart it on the same port, go on;
- ``hang``: the engine did not answer its readiness probe for ``hang_s`` -> SIGKILL, restart;
- ``error_rate``: a window's failed share reached the threshold;
- ``drift``: a watched series (acceptance, decode t/s, TTFT p95, engine RSS) trends the bad
  way by the robust test in harness/trend.py;
- ``restart_failed`` / ``gave_up``: the engine could not be brought back / too many restarts.

Window aggregates go to ``windows.jsonl``; slice starts and ends to ``soak_slices.jsonl``
(what ``specsoak resume`` reads to know how much soak time each configuration has had).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from engines.base import Engine, EngineCounters, counters_delta
from harness.cpu import CpuMeter
from harness.errors import EngineError
from harness.load.locust_proc import LocustProcess
from harness.records import JsonlWriter, read_jsonl
from harness.scenario import Configuration, Soak
from harness.trend import WATCHED, trend

if TYPE_CHECKING:
    from harness.runner import Runner

SOAK_DIR = "soak"
SLICES = "soak_slices.jsonl"
VERDICTS = "verdicts.jsonl"
WINDOWS = "windows.jsonl"
FAILURE_KINDS = ("crash", "hang", "error_rate", "restart_failed", "gave_up", "no_load")


@dataclass
class SliceResult:
    elapsed_s: float
    restarts: int
    verdicts: int
    gave_up: bool


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


def engine_rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**20
    except psutil.Error:
        return None


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


class SoakSlice:
    def __init__(self, runner: Runner, cfg: Configuration, slice_id: str, slice_s: float, offset_s: float, port: int, history: dict[str, list[dict[str, Any]]]):
        assert runner.run_dir is not None
        self.runner = runner
        self.cfg = cfg
        self.soak: Soak = runner.sc.soak  # type: ignore[assignment]
        self.wd = self.soak.watchdog
        self.slice_id = slice_id
        self.slice_s = slice_s
        self.offset_s = offset_s
        self.port = port
        self.run_dir: Path = runner.run_dir
        self.history = history  # config -> windows so far (drift needs the whole soak)
        self.engine: Engine | None = None
        self.restarts = 0
        self.verdict_count = 0
        self.flagged: set[str] = {v["metric"] for v in read_jsonl(self.run_dir / VERDICTS) if v.get("config") == cfg.name and v.get("kind") == "drift"}
        self.tail = RecordTail()
        self.records_seen = 0
        self.window: list[dict[str, Any]] = []
        self.window_t0 = 0.0
        self.window_counters: EngineCounters | None = None
        self.t_load = time.time()
        self.verdicts = JsonlWriter(self.run_dir / VERDICTS)
        self.windows = JsonlWriter(self.run_dir / WINDOWS)
        # CPU per window: engine, harness (this process and its Locust processes), everything else
        self.locust_pids: tuple[int, ...] = ()
        self.cpu_meter: CpuMeter | None = None

    # ---- verdicts --------------------------------------------------------------------
    def verdict(self, kind: str, message: str, evidence: dict[str, Any], action: str = "none", metric: str | None = None) -> None:
        rec = {"t_unix": time.time(), "config": self.cfg.name, "slice": self.slice_id, "kind": kind, "metric": metric,
               "message": message, "evidence": evidence, "action": action}
        self.verdicts.write(rec)
        self.verdict_count += 1
        self.runner.obs.on_verdict(rec)
        if kind in FAILURE_KINDS:
            self.runner.obs.on_failure({**rec, "stage": "soak"})
        self.runner.console.print(f"  [yellow]watchdog: {kind}{f' ({metric})' if metric else ''}: {message} -> {action}[/]")

    # ---- engine ----------------------------------------------------------------------
    def _start_engine(self) -> Engine:
        from harness.runner import launch_spec

        spec = launch_spec(self.runner.loaded, self.cfg, self.port)
        engine = self.runner.engine_cls(spec, self.run_dir / "logs" / f"{self.cfg.name}.soak.server.log")
        engine.start()
        try:
            engine.wait_ready(self.runner.sc.server.start_timeout_s)
            engine.check_speculation()
        except BaseException:
            engine.stop(0)
            self.engine = None
            raise
        self.runner.obs.on_config_start(self.cfg.name, self.cfg.algorithm, self.cfg.is_synthetic, engine.name, engine.base_url, engine.pid)
        return engine

    def _restart(self, why: str) -> bool:
        """Kill what is left and start again on the same port; a failed start is retried until max_restarts."""
        while True:
            if self.engine is not None:
                self.engine.stop(0 if why == "hang" else 2)
            if self.restarts >= self.wd.max_restarts:
                self.verdict("gave_up", f"{self.restarts} restarts already; the slice ends", {"restarts": self.restarts}, "stopped")
                return False
            self.restarts += 1
            try:
                self.engine = self._start_engine()
            except EngineError as exc:
                self.verdict("restart_failed", str(exc), {"after": why, "restarts": self.restarts}, "retry")
                why = "hang"
                continue
            self.window_counters = self._scrape()
            return True

    def _scrape(self) -> EngineCounters | None:
        try:
            return self.engine.scrape() if self.engine else None
        except EngineError:
            return None

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> SliceResult:
        slices = JsonlWriter(self.run_dir / SLICES)
        t_start = time.time()
        slices.write({"event": "start", "slice": self.slice_id, "config": self.cfg.name, "t_unix": t_start, "offset_s": self.offset_s, "slice_s": self.slice_s})
        self.engine = self._start_engine()
        key = self.engine.spec.api_key if self.engine is not None else None
        locust = LocustProcess(self._locust_config(), self.run_dir / SOAK_DIR, self.run_dir / "logs", self.soak.workers,
                               secret_env={"SPECSOAK_LOCUST_API_KEY": key} if key else None)
        gave_up = False
        t_load = self.t_load = time.time()
        try:
            self.window_t0 = time.time()
            self.window_counters = self._scrape()
            last_ok = time.monotonic()
            t_load = self.t_load = time.time()
            locust.start()
            self.locust_pids = tuple(locust.pids)
            self.cpu_meter = CpuMeter(self.engine.pid, client_pids=self.locust_pids).start()
            hard_stop = time.monotonic() + self.slice_s + 120
            while locust.alive() and time.monotonic() < hard_stop:
                time.sleep(self.wd.probe_interval_s)
                if not self.engine.alive():
                    code = self.engine.proc.returncode if self.engine.proc else None
                    reason = self.engine.failure_reason(self.engine.read_log()) or "no reason in its log"
                    self.verdict("crash", f"engine exited (code {code}): {reason}", {"exit_code": code, "pid": self.engine.pid}, "restart")
                    if not self._restart("crash"):
                        gave_up = True
                        break
                    last_ok = time.monotonic()
                    continue
                if self._healthy():
                    last_ok = time.monotonic()
                elif time.monotonic() - last_ok >= self.wd.hang_s:
                    status = _proc_status(self.engine.pid)
                    self.verdict("hang", f"no answer for {time.monotonic() - last_ok:.0f} s (process {status})",
                                 {"silent_s": round(time.monotonic() - last_ok, 1), "process_status": status, "pid": self.engine.pid}, "kill, restart")
                    if not self._restart("hang"):
                        gave_up = True
                        break
                    last_ok = time.monotonic()
                    continue
                self._consume(time.time())
        finally:
            locust.stop(grace_s=15)
            self._consume(time.time(), final=True)
            if self.records_seen == 0 and not gave_up:
                # the load itself failed (Locust crashed, or its user raised before recording anything)
                logs = sorted((self.run_dir / "logs").glob(f"locust-{self.slice_id}-*.log"))
                tail = logs[0].read_text(errors="replace").strip().splitlines()[-3:] if logs else []
                self.verdict("no_load", f"Locust sent no request in {time.time() - t_load:.0f} s (exit {locust.returncode()})",
                             {"locust_exit": locust.returncode(), "log_tail": tail}, "none")
            if self.engine is not None:
                self.engine.stop(self.runner.sc.server.stop_grace_s)
            elapsed = time.time() - t_load  # soak time is load time, not engine start-up
            stats = locust.stats_total()
            slices.write({"event": "end", "slice": self.slice_id, "config": self.cfg.name, "t_unix": time.time(), "elapsed_s": elapsed,
                          "restarts": self.restarts, "locust_stats": stats, "record_files": [p.name for p in locust.record_files()]})
            slices.close()
            self.verdicts.close()
            self.windows.close()
            self._compact(locust.record_files())
        return SliceResult(elapsed, self.restarts, self.verdict_count, gave_up)

    @staticmethod
    def _compact(files: list[Path]) -> None:
        """The slice's records as Parquet too, now that no one appends to them: the report only reads."""
        from harness.report.scale import compact_files

        try:
            compact_files(files)
        except OSError:
            pass  # the report compacts what is missing

    def _healthy(self) -> bool:
        assert self.engine is not None
        try:
            status, _ = self.engine.http_get(self.engine.health_path, timeout=min(5.0, max(0.5, self.wd.hang_s / 3)))
            return status == 200
        except OSError:
            return False

    def _locust_config(self) -> dict[str, Any]:
        from harness.prompts import load_prompts
        from harness.load.shapes import load_trace

        sc = self.runner.sc
        prompts = load_prompts(self.soak.prompts or "builtin:soak", self.runner.loaded.path.parent)
        trace = []
        if self.soak.shape.trace:
            path = Path(self.soak.shape.trace)
            trace = load_trace(path if path.is_absolute() else self.runner.loaded.path.parent / path)
        assert self.engine is not None
        params = self.runner.params
        return {
            "url": self.engine.request_url,
            "chat_path": self.engine.chat_path,
            "engine": self.engine.name,
            "extras": self.engine.request_extras(),
            "params": {"max_tokens": self.soak.max_tokens or sc.measurement.max_tokens, "temperature": params.temperature,
                       "seed": params.seed, "ignore_eos": True, "timeout_s": params.timeout_s, "stall_s": self.soak.stall_s, "keep_text": True},
            "prompts": [p.to_dict() for p in prompts],
            "shape": self.soak.shape.model_dump(),
            "duration_s": self.soak.duration_s,
            "offset_s": self.offset_s,
            "slice_s": self.slice_s,
            "slice_id": self.slice_id,
            "records_dir": str(self.run_dir / SOAK_DIR),
            "config": self.cfg.name,
            "trace": trace,
        }

    # ---- windows: error rate and drift -----------------------------------------------
    def _consume(self, now: float, final: bool = False) -> None:
        new = self.tail.read(sorted((self.run_dir / SOAK_DIR).glob(f"{self.slice_id}-*.jsonl")))
        self.records_seen += len(new)
        for r in new:
            self.runner.obs.on_request(r)
        self.window.extend(new)
        if now - self.window_t0 >= self.wd.window_s or (final and self.window):
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        recs = self.window
        ok = [r for r in recs if r.get("status") == "ok"]
        errors = len(recs) - len(ok)
        counters = self._scrape()
        acceptance = mean_len = None
        if counters is not None and self.window_counters is not None:
            d = counters_delta(self.window_counters, counters)
            if (d.draft_tokens or 0) < 0 or (d.accepted_tokens or 0) < 0:  # engine restarted: counters began again
                d = counters
            if d.draft_tokens:
                acceptance = (d.accepted_tokens or 0) / d.draft_tokens
            if d.verify_steps:
                mean_len = 1 + (d.accepted_tokens or 0) / d.verify_steps
        decode = [r["decode_tps"] for r in ok if r.get("decode_tps")]
        ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
        kinds: dict[str, int] = defaultdict(int)
        for r in recs:
            if r.get("error_kind"):
                kinds[r["error_kind"]] += 1
        win = {
            "config": self.cfg.name, "slice": self.slice_id, "t_start_unix": self.window_t0, "t_end_unix": now,
            "t_unix": (self.window_t0 + now) / 2, "requests": len(recs), "errors": errors, "error_kinds": dict(kinds),
            "output_tokens": sum(r.get("output_tokens") or 0 for r in ok),
            "decode_tps": float(np.median(decode)) if decode else None,
            "ttft_p95_s": float(np.percentile(ttft, 95)) if ttft else None,
            "acceptance": acceptance, "mean_accept_len": mean_len,
            "engine_rss_mib": engine_rss_mib(self.engine.pid if self.engine else None),
        }
        if self.cpu_meter is not None:
            cpu = self.cpu_meter.stop()
            win["cpu"] = {"engine_cpu_s": cpu.engine_cpu_s, "harness_cpu_s": cpu.harness_cpu_s, "other_cpu_s": cpu.other_cpu_s,
                          "engine_cores": cpu.engine_cores, "harness_cores": cpu.harness_cores, "other_cores": cpu.other_cores,
                          "engine_restarted": self.engine is None or self.engine.pid != self.cpu_meter.engine_pid}
            win["contaminated"] = cpu.other_cores > self.runner.sc.measurement.contamination_cores
            self.cpu_meter = CpuMeter(self.engine.pid if self.engine else None, client_pids=self.locust_pids).start()
        self.windows.write(win)
        self.history.setdefault(self.cfg.name, []).append(win)
        done = self.offset_s + (now - self.t_load)
        self.runner.console.print(
            f"  soak {self.cfg.name} {done:,.0f}/{self.soak.duration_s:,.0f} s: {len(recs)} requests, {errors} failed"
            + (f", decode {win['decode_tps']:.1f} t/s" if win["decode_tps"] else "")
            + (f", TTFT p95 {win['ttft_p95_s']:.2f} s" if win["ttft_p95_s"] is not None else "")
            + (f", acceptance {acceptance:.2f}" if acceptance is not None else "")
            + (f", engine RSS {win['engine_rss_mib']:.0f} MiB" if win["engine_rss_mib"] else ""),
            highlight=False,
        )
        self.window, self.window_t0, self.window_counters = [], now, counters
        if len(recs) >= self.wd.min_requests and errors / len(recs) >= self.wd.error_rate:
            self.verdict("error_rate", f"{errors} of {len(recs)} requests failed in the last window", {"window": win}, "none")
        self._drift()

    def _drift(self) -> None:
        wins = self.history.get(self.cfg.name, [])
        if len(wins) < self.wd.drift_min_windows:
            return
        for metric, bad in WATCHED.items():
            if metric in self.flagged:
                continue
            pts = [(w["t_unix"], w[metric]) for w in wins if w.get(metric) is not None]
            if len(pts) < self.wd.drift_min_windows:
                continue
            tr = trend(metric, [p[0] for p in pts], [p[1] for p in pts], bad, self.wd.drift_alpha, self.wd.drift_min_change)
            if tr is not None and tr.drifting:
                self.flagged.add(metric)
                self.verdict("drift", f"{metric} {'rises' if bad > 0 else 'falls'} {abs(tr.relative_change):.0%} over the soak "
                             f"(Theil-Sen {tr.slope_per_hour:+.3g}/h, CI [{tr.slope_low_per_hour:+.3g}, {tr.slope_high_per_hour:+.3g}], p={tr.p_value:.2g})",
                             tr.to_dict(), "none", metric=metric)


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
