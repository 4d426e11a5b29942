"""Measure one client process tree against one fake server: CPU, memory, streams, timing error.

Each measurement starts a fresh fake server (bench/fake_server.py) as its own process, runs
the client command to completion, stops the server (which writes its send log) and compares.
CPU is split the way harness/probe/cpu.py splits a phase: the client's whole process tree, the fake
server, this process (the sampler), and everything else on the machine (``other``), so a
figure taken while other processes were busy says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from harness.probe.cpu import machine_busy_seconds, self_cpu_seconds, tree_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
CONTAMINATION_CORES = 0.05


@dataclass(frozen=True)
class Level:
    streams: int
    requests: int
    max_tokens: int
    ttft_ms: float
    itl_ms: float
    stall_every: int = 32
    stall_factor: float = 4.0

    @property
    def stall_ms(self) -> float:
        return self.itl_ms * self.stall_factor

    @property
    def expected_s(self) -> float:
        """Wall time of the whole run if the client keeps every stream busy."""
        per_req = self.ttft_ms + (self.max_tokens - 1) * self.itl_ms
        per_req += (self.max_tokens - 1) // self.stall_every * (self.stall_ms - self.itl_ms) if self.stall_every else 0
        return per_req / 1e3 * max(1, self.requests // self.streams)


@dataclass
class Result:
    client: str
    streams: int
    requests_sent: int = 0
    requests_completed: int = 0
    failed: int | None = None
    tokens: int = 0
    wall_s: float = 0.0
    run_s: float = 0.0
    client_cpu_s: float = 0.0
    client_run_cpu_s: float = 0.0
    peak_rss_mib: float = 0.0
    achieved_streams: int = 0
    server_cpu_s: float = 0.0
    other_cores: float = 0.0
    load_avg_1m: float = 0.0
    contaminated: bool = False
    ttft_err_p50_ms: float | None = None
    ttft_err_p99_ms: float | None = None
    itl_err_p50_ms: float | None = None
    itl_err_p99_ms: float | None = None
    chunk_err_p50_ms: float | None = None
    chunk_err_p99_ms: float | None = None
    itl_p99_true_ms: float | None = None
    itl_p99_reported_ms: float | None = None
    itl_kind: str = ""
    server_late_p99_ms: float | None = None
    exit_code: int | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_s_per_1k_tokens(self) -> float | None:
        return self.client_cpu_s / self.tokens * 1000 if self.tokens else None

    @property
    def client_cores(self) -> float | None:
        return self.client_run_cpu_s / self.run_s if self.run_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_s_per_1k_tokens": self.cpu_s_per_1k_tokens, "client_cores": self.client_cores}


@dataclass
class ServerLog:
    requests: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path) -> ServerLog:
        return cls([json.loads(line) for line in path.read_text().splitlines() if line.strip()])

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["completed"]]

    def tokens(self) -> int:
        return sum(len(r["sent_ns"]) for r in self.completed)

    def window_ns(self) -> tuple[int, int]:
        return min(r["recv_ns"] for r in self.requests), max(r["end_ns"] for r in self.requests)

    def max_concurrency(self) -> int:
        ev = sorted(
            [(r["recv_ns"], 1) for r in self.requests] + [(r["end_ns"], -1) for r in self.requests],
            key=lambda e: (e[0], e[1]),
        )
        cur = best = 0
        for _, d in ev:
            cur += d
            best = max(best, cur)
        return best

    def true_ttft_ms(self) -> np.ndarray:
        return np.array([(r["sent_ns"][0] - r["recv_ns"]) / 1e6 for r in self.completed if r["sent_ns"]])

    def true_itl_ms(self) -> np.ndarray:
        gaps = [np.diff(np.array(r["sent_ns"], dtype=np.int64)) / 1e6 for r in self.completed if len(r["sent_ns"]) > 1]
        return np.concatenate(gaps) if gaps else np.array([])

    def late_ms(self) -> np.ndarray:
        late = [np.array(r["late_ns"]) / 1e6 for r in self.requests if r["late_ns"]]
        return np.concatenate(late) if late else np.array([])


def q(a: np.ndarray | list[float], p: float) -> float | None:
    a = np.asarray(a, dtype=float)
    return float(np.percentile(a, p)) if a.size else None


class TreeSampler:
    """Polls a process tree: CPU seconds (last seen per process, so exited ones still count) and RSS."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.seen: dict[tuple[int, float], float] = {}
        self.samples: list[tuple[int, float]] = []  # (perf_counter_ns, tree cpu s)
        self.peak_rss = 0

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    self.seen[(p.pid, p.create_time())] = t.user + t.system
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.samples.append((time.perf_counter_ns(), sum(self.seen.values())))

    def cpu_between(self, t0_ns: int, t1_ns: int) -> float:
        if len(self.samples) < 2:
            return 0.0
        ts = np.array([s[0] for s in self.samples], dtype=float)
        cs = np.array([s[1] for s in self.samples], dtype=float)
        return float(np.interp(t1_ns, ts, cs) - np.interp(t0_ns, ts, cs))


def start_server(level: Level, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    log, port_file = work / "server.jsonl", work / "server.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "bench.fake_server",
        "--ttft-ms",
        str(level.ttft_ms),
        "--itl-ms",
        str(level.itl_ms),
        "--stall-every",
        str(level.stall_every),
        "--stall-ms",
        str(level.stall_ms),
        "--tokens",
        str(level.max_tokens),
        "--log",
        str(log),
        "--port-file",
        str(port_file),
    ]
    out = open(work / "server.out", "wb")  # noqa: SIM115  the child owns it
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"fake server did not start: {(work / 'server.out').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}", log


def run_client(
    res: Result, cmd: list[str], work: Path, server_pid: int, timeout_s: float, env: dict[str, str] | None = None
) -> TreeSampler:
    """Run one client command to completion; fill in its CPU, RSS and the machine's CPU split."""
    (work / "command.txt").write_text(" ".join(cmd) + "\n")
    busy0, self0, srv0, t0 = (
        machine_busy_seconds(),
        self_cpu_seconds(),
        tree_cpu_seconds(server_pid),
        time.perf_counter(),
    )
    out = open(work / "client.out", "wb")  # noqa: SIM115  the child owns it
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    out.close()
    sampler = TreeSampler(proc.pid)
    status, rusage = 0, None
    while True:
        sampler.sample()
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)
            _, status, rusage = os.wait4(proc.pid, 0)
            res.note = f"killed after {timeout_s:.0f} s"
            break
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything of the client's left behind
    res.wall_s = time.perf_counter() - t0
    srv_cpu = tree_cpu_seconds(server_pid) - srv0
    busy, mine = machine_busy_seconds() - busy0, self_cpu_seconds() - self0
    res.exit_code = proc.returncode
    reaped = rusage.ru_utime + rusage.ru_stime if rusage else 0.0
    polled = sum(sampler.seen.values())
    res.client_cpu_s = max(reaped, polled)  # descendants a client never reaps are only seen by polling
    res.peak_rss_mib = max(sampler.peak_rss, (rusage.ru_maxrss * 1024 if rusage else 0)) / 2**20
    res.server_cpu_s = srv_cpu
    res.other_cores = max(0.0, busy - res.client_cpu_s - srv_cpu - mine) / res.wall_s
    res.contaminated = res.other_cores > CONTAMINATION_CORES
    return sampler


def measure(
    client: str, level: Level, work: Path, make_cmd: Any, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[Result, ServerLog | None]:
    """Run ``make_cmd(url)`` (an argument list) to completion against a fresh fake server."""
    work.mkdir(parents=True, exist_ok=True)
    res = Result(client, level.streams, load_avg_1m=os.getloadavg()[0])
    server, url, log = start_server(level, work)
    try:
        sampler = run_client(res, make_cmd(url), work, server.pid, timeout_s, env)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if not log.exists():
        res.note = (res.note + "; " if res.note else "") + "no server log"
        return res, None
    slog = ServerLog.read(log)
    if slog.requests:
        w0, w1 = slog.window_ns()
        res.run_s = (w1 - w0) / 1e9
        res.client_run_cpu_s = sampler.cpu_between(w0, w1)
        res.achieved_streams = slog.max_concurrency()
        res.requests_sent = len(slog.requests)
        res.requests_completed = len(slog.completed)
        res.tokens = slog.tokens()
        res.server_late_p99_ms = q(slog.late_ms(), 99)
        res.itl_p99_true_ms = q(slog.true_itl_ms(), 99)
    return res, slog


def quantile_errors(res: Result, slog: ServerLog, ttft_ms: np.ndarray, itl_ms: np.ndarray, itl_kind: str) -> None:
    """|reported quantile - true quantile| for TTFT and ITL, p50 and p99 (true = the server's send log)."""
    true_ttft, true_itl = slog.true_ttft_ms(), slog.true_itl_ms()

    def err(a: np.ndarray, b: np.ndarray, p: float) -> float | None:
        x, y = q(a, p), q(b, p)
        return abs(x - y) if x is not None and y is not None else None

    res.ttft_err_p50_ms, res.ttft_err_p99_ms = err(ttft_ms, true_ttft, 50), err(ttft_ms, true_ttft, 99)
    res.itl_err_p50_ms, res.itl_err_p99_ms = err(itl_ms, true_itl, 50), err(itl_ms, true_itl, 99)
    res.itl_p99_reported_ms = q(itl_ms, 99)
    res.itl_kind = itl_kind


def chunk_errors(res: Result, slog: ServerLog, records: list[dict[str, Any]]) -> None:
    """Per-chunk error of a harness record: each measured gap minus the server's own gap for that chunk.

    Records are paired with the server's requests by prompt key and the nearest start time.
    """
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in slog.completed:
        by_key.setdefault(r["key"], []).append(r)
    errs: list[np.ndarray] = []
    for rec in records:
        if rec.get("status") != "ok" or not rec.get("itl_s"):
            continue
        cands = by_key.get(rec["prompt_id"], [])
        if not cands:
            continue
        srv = min(cands, key=lambda r: abs(r["recv_unix"] - rec["start_unix_s"]))
        true = np.diff(np.array(srv["sent_ns"], dtype=np.int64)) / 1e6
        got = np.array(rec["itl_s"], dtype=float) * 1e3
        if got.size != true.size:
            continue
        errs.append(np.abs(got - true))
    if errs:
        e = np.concatenate(errs)
        res.chunk_err_p50_ms, res.chunk_err_p99_ms = q(e, 50), q(e, 99)


def read_records(paths: list[Path]) -> list[dict[str, Any]]:
    from harness.records.files import read_jsonl

    return [r for p in paths for r in read_jsonl(p)]
