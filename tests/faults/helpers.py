"""Scenario and process helpers of the fault suite (real llama-server, real CLI in a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.integration.conftest import SMOLLM2

SHORT_JSONL = '{"id": "short", "messages": [{"role": "user", "content": "Count from one to twenty."}]}\n'


def scenario(
    tmp_path: Path,
    server: dict[str, Any] | None = None,
    measurement: dict[str, Any] | None = None,
    configs: list[dict[str, Any]] | None = None,
) -> Path:
    (tmp_path / "short.jsonl").write_text(SHORT_JSONL)
    data = {
        "name": "faults",
        "server": {
            "model": SMOLLM2,
            "ctx_size": 1024,
            "parallel": 2,
            "threads": 2,
            "stop_grace_s": 3,
            **(server or {}),
        },
        "configurations": configs or [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "short.jsonl",
            "max_tokens": 16,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
            **(measurement or {}),
        },
    }
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", **(env or {})}
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        preexec_fn=pre,
        check=False,
    )


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        start_new_session=True,
    )


def wait_for(cond: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"harness exited ({proc.returncode}) while waiting for {what}:\n{proc.stdout.read() if proc.stdout else ''}"
            )
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"harness did not finish in {timeout} s:\n{out[-4000:]}") from None
    return out


def child_running(pid: int, needle: str) -> psutil.Process | None:
    """A live (not zombie) descendant of ``pid`` whose command line holds ``needle``."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    for k in kids:
        try:
            if needle in " ".join(k.cmdline()) and k.status() != psutil.STATUS_ZOMBIE:
                return k
        except psutil.Error:
            continue
    return None


def engine_child(harness_pid: int) -> psutil.Process | None:
    return child_running(harness_pid, "llama-server")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_dir(results: Path) -> Path | None:
    dirs = sorted(results.glob("*-faults")) if results.exists() else []  # the run folder, not prometheus-targets/
    return dirs[0] if dirs else None


def lines_and_records(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """Every line of a JSONL file must be a complete record: (lines, records)."""
    if not path.exists():
        return 0, []
    lines = path.read_text().splitlines()
    return len(lines), [json.loads(ln) for ln in lines]


def manifest(run: Path) -> dict[str, Any]:
    return json.loads((run / "manifest.json").read_text())
