"""Process control shared by every engine: start a program in its own process group that dies with the
harness, stop the whole group without orphans, describe how it ended, find the process behind a local port.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
import urllib.parse


def set_parent_death_signal() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the harness, never orphaned
    except OSError:
        pass


def spawn(cmd: list[str], extra_env: dict[str, str], stdout: int) -> subprocess.Popen[bytes]:
    """``cmd`` with ``extra_env`` added to this environment, stdout and stderr to ``stdout``, in a new process
    group (``stop_group`` signals all of it) that gets SIGKILL when the harness dies."""
    return subprocess.Popen(
        cmd,
        env={**os.environ, **extra_env} if extra_env else None,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=set_parent_death_signal,  # noqa: PLW1509  the callable only calls prctl: no locks
    )


LEDGER_ENV = "SPECSOAK_ENGINE_LEDGER"


def note_start(engine: str, pid: int, log: str) -> None:
    """With ``SPECSOAK_ENGINE_LEDGER`` set, one JSON line per engine launched (the test suite counts its engine starts
    per file from it: tests/timing.py). A ledger that cannot be written is not the engine's failure."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "a") as f:
        f.write(json.dumps({"engine": engine, "pid": pid, "unix": round(time.time(), 3), "log": log}) + "\n")


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """SIGTERM to ``proc``'s process group, then SIGKILL after ``grace_s``; a group whose leader already
    exited gets SIGKILL for its stray children. Returns the leader's exit status."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    else:
        signal_group(proc.pid, signal.SIGKILL)  # stray children of a dead leader
    return proc.returncode


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def describe_exit(code: int | None) -> str:
    """An exit status as people read it: '1', 'signal SIGKILL', 'unknown'."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return str(code)


def listening_pid(url: str) -> int | None:
    """The local process listening on ``url``'s port, when the server runs on this machine and the OS tells
    (psutil; None for a remote server, or when the socket's owner cannot be read)."""
    import psutil

    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
