"""Start and stop Locust (local, or a master and workers on loopback) for one soak slice.

The harness never imports locust: it writes the slice's JSON config, starts
``python -m locust -f harness/load/locustfile.py --headless`` as child processes (argument
lists, logs to files, parent-death signal so none outlives the harness), and reads back the
JSONL records the Locust processes append.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from engines.process import set_parent_death_signal
from harness.common.net import free_port

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


class LocustProcess:
    def __init__(
        self,
        config: dict[str, Any],
        work_dir: Path,
        log_dir: Path,
        workers: int = 0,
        stop_timeout_s: float = 30.0,
        secret_env: dict[str, str] | None = None,
        remote: dict[str, Any] | None = None,
    ):
        # remote: soak.remote_workers (count, bind, port, wait_s): the master waits for workers started elsewhere
        self.remote = remote
        if remote is not None:
            workers = int(remote["count"])
        self.config = {**config, "workers": workers, "remote": remote is not None}
        self.secret_env = dict(secret_env or {})  # an API key travels in the environment, never in the config file
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.workers = workers
        self.stop_timeout_s = stop_timeout_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.slice_id = str(config["slice_id"])
        self.csv_prefix = log_dir / f"locust-{self.slice_id}"
        self.json_path = log_dir / f"locust-{self.slice_id}-stats"

    def _cmd(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING", *extra]

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.work_dir / f"{self.slice_id}.locust.json"
        cfg_path.write_text(json.dumps(self.config))
        env = dict(os.environ, SPECSOAK_LOCUST_CONFIG=str(cfg_path), PYTHONUNBUFFERED="1", **self.secret_env)
        stop_timeout = str(math.ceil(self.stop_timeout_s))  # Locust takes whole seconds ("5.3" is refused)
        common = ["--headless", "--host", self.config["url"], "--stop-timeout", stop_timeout]
        if self.workers == 0:
            self._spawn(
                "local",
                self._cmd(*common, "--csv", str(self.csv_prefix), "--json-file", str(self.json_path), "--only-summary"),
                env,
            )
            return
        bind, port = ("127.0.0.1", free_port()) if self.remote is None else (self.remote["bind"], self.remote["port"])
        wait = [] if self.remote is None else ["--expect-workers-max-wait", str(math.ceil(self.remote["wait_s"]))]
        master = self._cmd(
            *common,
            "--master",
            "--master-bind-host",
            bind,
            "--master-bind-port",
            str(port),
            "--expect-workers",
            str(self.workers),
            *wait,
            "--csv",
            str(self.csv_prefix),
            "--json-file",
            str(self.json_path),
            "--only-summary",
        )
        self._spawn("master", master, env)
        if self.remote is not None:
            return  # the workers are started on their own hosts (specsoak worker)
        for i in range(self.workers):
            # a worker stops its users with its own --stop-timeout: without it, requests in flight when
            # the slice ends are killed unrecorded
            self._spawn(
                f"worker{i}",
                self._cmd(
                    "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), "--stop-timeout", stop_timeout
                ),
                env,
            )

    def _spawn(self, role: str, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.log_dir / f"locust-{self.slice_id}-{role}.log", "ab", buffering=0)  # noqa: SIM115  closed in stop()
        self._logs.append(log)
        self.procs.append(
            subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=set_parent_death_signal,  # noqa: PLW1509  prctl(PR_SET_PDEATHSIG) has no Popen argument
            )
        )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> bool:
        """The load runs while the local runner or the master runs."""
        return bool(self.procs) and self.procs[0].poll() is None

    def returncode(self) -> int | None:
        return self.procs[0].returncode if self.procs else None

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.procs[0].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                _group(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _group(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def record_files(self) -> list[Path]:
        return sorted(Path(self.config["records_dir"]).glob(f"{self.slice_id}-*.jsonl"))

    def stats_total(self) -> dict[str, int] | None:
        """Locust's own final request and failure counts for the slice (its JSON stats), or None."""
        for path in (Path(f"{self.json_path}.json"), self.json_path):
            try:
                entries = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            return {
                "requests": sum(int(e.get("num_requests", 0)) for e in entries),
                "failures": sum(int(e.get("num_failures", 0)) for e in entries),
            }
        return None


def _group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def worker_command(master_host: str, master_port: int) -> list[str]:
    """One Locust worker of a soak's remote workers (soak.remote_workers), pointed at the harness's master."""
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--loglevel",
        "WARNING",
        "--worker",
        "--master-host",
        master_host,
        "--master-port",
        str(master_port),
    ]


def run_workers(master_host: str, master_port: int, processes: int, say: Any = print) -> int:
    """``processes`` Locust workers for a soak on another host, each started again when it ends (a soak starts one
    master per slice), until SIGINT or SIGTERM; returns 0. No config file: each takes the slice's from the master."""
    import time

    stopping: list[int] = []

    def _stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    env = {k: v for k, v in os.environ.items() if k != "SPECSOAK_LOCUST_CONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    procs: list[subprocess.Popen[bytes] | None] = [None] * processes
    starts = [0] * processes
    ended: list[float | None] = [None] * processes
    try:
        while not stopping:
            for i, p in enumerate(procs):
                if p is not None and p.poll() is not None and ended[i] is None:
                    ended[i] = time.monotonic()
                    if p.returncode != 0:
                        say(f"specsoak worker {i}: Locust exited with {p.returncode}; starting it again")
                # after a slice's master quit, wait for it to be gone: a new worker must meet the next one
                if p is None or (p.poll() is not None and time.monotonic() - (ended[i] or 0.0) >= 3.0):
                    ended[i] = None
                    procs[i] = subprocess.Popen(
                        worker_command(master_host, master_port),
                        env=env,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        preexec_fn=set_parent_death_signal,  # noqa: PLW1509  prctl(PR_SET_PDEATHSIG) has no Popen argument
                    )
                    starts[i] += 1
            time.sleep(0.5)
    finally:
        for p in procs:
            if p is not None and p.poll() is None:
                _group(p.pid, signal.SIGTERM)
        for p in procs:
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _group(p.pid, signal.SIGKILL)
        for s, h in old.items():
            signal.signal(s, h)
    say(f"specsoak worker: stopped ({sum(starts)} Locust worker starts)")
    return 0
