"""How much disk a run needs, and the soak's watch on the free space left (docs/soak.md#disk-space).

``validate`` and ``plan`` estimate the run folder's size from the scenario: the request records the soak and
the phases write (bytes per record measured from real runs), the soak's windows, and each engine log at its
bound (``report.engine_log_max_mib``: llama-server's prompt-cache listing grows with every distinct prompt, so
a soak's log reaches its bound). The soak checks the results disk every window: a ``disk`` verdict (default
action stop_run) when the free space is below ``soak.watchdog.disk_min_free_mib``, or will be within two
windows at the rate the disk filled since the last window, so the run stops with its records whole.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.logcapture import summarise_logs
from harness.config.estimate import ASSUMED_STREAM_TPS
from harness.config.schema import Scenario, Watchdog

MIB = 2**20
# a request record in requests.jsonl or a soak record file: its fields, then one inter-token gap (~10 characters)
# per output token (tests/fixtures/run_quick: 2,126 bytes a record at 128 tokens; the soak's records: docs/soak.md)
RECORD_BYTES = 850
RECORD_BYTES_PER_TOKEN = 10
# a soak window in windows.jsonl with its detector state (a real soak of llama-server: 16,008 bytes for 8 windows)
WINDOW_BYTES = 2_000
# engine log bytes a request adds before compression, averaged over a soak (docs/soak.md#engine-logs): llama-server at
# -lv 4 lists every cached prompt on every request, so its figure grows with the cache; vLLM logs only periodic stats.
ENGINE_LOG_BYTES_PER_REQUEST = {"llamacpp": 100_000, "vllm": 1_000}
FORECAST_WINDOWS = 2  # a disk verdict when the free space runs out within this many windows at the last window's rate


@dataclass(frozen=True)
class FolderEstimate:
    """Bytes a run of a scenario writes, by part (engine logs at their engine's bytes per request, each at most its bound)."""

    requests: int
    records_bytes: int
    windows_bytes: int
    engine_logs: int
    engine_logs_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.records_bytes + self.windows_bytes + self.engine_logs_bytes


def record_bytes(max_tokens: int) -> int:
    return RECORD_BYTES + RECORD_BYTES_PER_TOKEN * max_tokens


def folder_estimate(sc: Scenario) -> FolderEstimate:
    """The run folder's size for ``sc``: records of the phases and the soak, soak windows, engine logs."""
    m = sc.measurement
    n_cfg = len(sc.runs())
    if m.arrival is not None:
        phase_requests = m.repetitions * m.arrival.requests * len(m.arrival.keys())
    else:
        phase_requests = m.repetitions * m.requests_per_stream * sum(m.streams)
    requests = n_cfg * (m.warmup_requests + phase_requests)
    records = requests * record_bytes(m.max_tokens)
    windows = 0
    starts = m.repetitions if m.design == "interleaved" else 1
    logs = [(m.warmup_requests + phase_requests / starts)] * (n_cfg * starts)  # requests each engine log sees
    if sc.soak is not None:
        soak = sc.soak
        tokens = soak.max_tokens or m.max_tokens
        n_soak = len(sc.soak_configurations())
        if soak.arrival is not None:
            per_cfg = soak.arrival.mean_rps(soak.duration_s) * soak.duration_s
        else:  # closed loop: each user sends one request after the other, at the assumed speed per stream
            per_cfg = soak.shape.users * soak.duration_s / (tokens / ASSUMED_STREAM_TPS + 0.5)
        soak_requests = int(n_soak * (per_cfg + phase_requests))
        requests += soak_requests
        records += soak_requests * record_bytes(tokens)
        windows = int(n_soak * soak.duration_s / soak.watchdog.window_s) * WINDOW_BYTES
        slices = int(-(-soak.duration_s // soak.slice_s)) if soak.slice_s else 1
        logs += [per_cfg / slices + phase_requests] * (n_soak * slices)
    per_request = ENGINE_LOG_BYTES_PER_REQUEST.get(sc.server.engine, max(ENGINE_LOG_BYTES_PER_REQUEST.values()))
    bound = sc.report.engine_log_max_mib * MIB
    return FolderEstimate(requests, records, windows, len(logs), int(sum(min(bound, n * per_request) for n in logs)))


def free_bytes(path: Path) -> int | None:
    """Free bytes (for this user) on the filesystem that holds ``path`` or its nearest existing parent."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_warnings(sc: Scenario, results: Path) -> list[str]:
    """What ``validate`` says about the disk: the run folder's estimated size, and a warning when ``results`` cannot hold it."""
    est = folder_estimate(sc)
    free = free_bytes(results)
    need = est.total_bytes + (int(sc.soak.watchdog.disk_min_free_mib * MIB) if sc.soak is not None else 0)
    if free is None or need <= free:
        return []
    return [
        f"the run folder may need {est.total_bytes / MIB:,.0f} MiB ({est.requests:,} request records "
        f"{est.records_bytes / MIB:,.0f} MiB, soak windows {est.windows_bytes / MIB:,.0f} MiB, {est.engine_logs} engine logs "
        f"{est.engine_logs_bytes / MIB:,.0f} MiB, each at most {sc.report.engine_log_max_mib:g} MiB)"
        + (
            f" plus the soak's {sc.soak.watchdog.disk_min_free_mib:g} MiB of free space kept"
            if sc.soak is not None
            else ""
        )
        + f", and {results} has {free / MIB:,.0f} MiB free: the soak would "
        "stop with a 'disk' verdict; free space, lower report.engine_log_max_mib, or use --results on a larger disk"
    ]


def describe_estimate(sc: Scenario) -> str:
    est = folder_estimate(sc)
    return (
        f"run folder about {est.total_bytes / MIB:,.0f} MiB ({est.requests:,} request records {est.records_bytes / MIB:,.0f} MiB, "
        f"soak windows {est.windows_bytes / MIB:,.0f} MiB, {est.engine_logs} engine logs {est.engine_logs_bytes / MIB:,.0f} MiB, "
        f"each at most {sc.report.engine_log_max_mib:g} MiB: report.engine_log_max_mib)"
    )


class DiskWatch:
    """The soak's check of the results disk, once a window: a message for a 'disk' verdict, or None."""

    def __init__(self, run_dir: Path, wd: Watchdog, free: Any = None):
        self.run_dir = run_dir
        self.min_free = wd.disk_min_free_mib * MIB
        self.window_s = wd.window_s
        self._free = free or (lambda: free_bytes(run_dir))  # injectable: tests feed it a filling disk
        self.last: tuple[float, int] | None = None
        self.warned = False  # one verdict while the disk stays short (an action of 'record' goes on soaking)

    def check(self, now: float) -> tuple[str, dict[str, Any]] | None:
        free = self._free()
        if free is None:
            return None
        last, self.last = self.last, (now, free)
        rate = (
            (last[1] - free) / (now - last[0]) if last is not None and now > last[0] else 0.0
        )  # bytes/s the disk fills
        evidence = {
            "free_mib": round(free / MIB, 1),
            "min_free_mib": self.min_free / MIB,
            "fill_mib_per_s": round(rate / MIB, 3),
            "total_mib": round(shutil.disk_usage(self.run_dir).total / MIB, 1) if self.run_dir.exists() else None,
        }
        if self.warned:
            self.warned = free < self.min_free * 2  # said again once the disk had room and runs short anew
            return None
        self.warned = True
        if free < self.min_free:
            return (
                f"the results disk has {free / MIB:,.0f} MiB free, below soak.watchdog.disk_min_free_mib "
                f"({self.min_free / MIB:,.0f} MiB)"
            ), evidence
        horizon_s = FORECAST_WINDOWS * self.window_s
        if rate > 0 and (free - self.min_free) / rate < horizon_s:
            return (
                f"the results disk fills at {rate / MIB:,.2f} MiB/s: its {free / MIB:,.0f} MiB free fall below "
                f"{self.min_free / MIB:,.0f} MiB within {(free - self.min_free) / rate:,.0f} s (two windows)"
            ), evidence
        self.warned = False
        return None


def engine_log_notes(run_dir: Path, run_id: str) -> list[str]:
    """The report's notes on engine logs that hit their bound: how much each dropped, and what it keeps."""
    out: list[str] = []
    out.extend(
        f"**Engine log** (run {run_id}): {s.dropped_bytes / MIB:,.1f} MiB dropped from {s.log} "
        f"(of {s.written_bytes / MIB:,.1f} MiB written; kept: its start-up section, the newest output in "
        f"{s.segments} gzip segment{'s' if s.segments != 1 else ''}, {s.kept_bytes / MIB:,.1f} MiB on disk; "
        "report.engine_log_max_mib)."
        for s in summarise_logs(run_dir)
        if s.dropped_bytes > 0
    )
    return out
