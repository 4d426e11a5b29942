"""Faults planted inside the real llama-server a soak runs, by signals to its process (tests only).

The soak's engine is found among the harness's children by its log: logs/<config>.soak.server.log (the measurement's
engine has no '.soak'), a file the harness's log thread holds open while that engine runs (engines/logcapture.py).
SIGSTOP freezes it whole: no other process takes the CPU, which the harness would rightly call contamination.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import psutil

from tests.faults.helpers import engine_child

SLOW_PERIOD_S = 0.2  # a slower machine: the engine runs (speed x this) of every period


def logs_to_soak(eng: psutil.Process | None, harness_pid: int, config: str | None = None) -> bool:
    """``eng`` is a soak's engine (of ``config``, when named): the harness holds its soak log open."""
    if eng is None:
        return False
    suffix = f"{config}.soak.server.log" if config else ".soak.server.log"
    try:
        return any(f.path.endswith(suffix) for f in psutil.Process(harness_pid).open_files())
    except psutil.Error:
        return False


def soak_engine(harness_pid: int, config: str | None = None) -> psutil.Process | None:
    eng = engine_child(harness_pid)
    return eng if logs_to_soak(eng, harness_pid, config) else None


class DutyCyclePlant(threading.Thread):
    """SIGSTOP/SIGCONT on the soak engine once it is ``plant_after_s`` old (or once ``go`` is set, with
    ``plant_after_s`` None): ``stopped_s`` of every ``period_s`` frozen. ``speed`` < 1: from its start, the engine also
    runs only that share of every SLOW_PERIOD_S (a slower machine); ``plant`` False: only that. ``config``: the soak
    engine of that configuration only."""

    def __init__(
        self,
        harness_pid: int,
        stopped_s: float = 0.85,
        period_s: float = 1.0,
        speed: float = 1.0,
        plant: bool = True,
        plant_after_s: float | None = None,
        config: str | None = None,
    ):
        super().__init__(daemon=True)
        self.harness_pid = harness_pid
        self.plant_after_s = plant_after_s
        self.stopped_s, self.period_s = stopped_s, period_s
        self.speed, self.plant, self.config = speed, plant, config
        self.onset_unix: float | None = None
        self.engine_started_unix: float | None = None
        self.go = threading.Event()
        self.done = threading.Event()

    def _due(self) -> bool:
        if not self.plant:
            return False
        if self.plant_after_s is None:
            return self.go.is_set()
        assert self.engine_started_unix is not None
        return time.time() >= self.engine_started_unix + self.plant_after_s

    def run(self) -> None:
        eng = None
        while not self.done.is_set() and eng is None:
            eng = soak_engine(self.harness_pid, self.config)
            time.sleep(0.2)
        if eng is None:
            return
        self.engine_started_unix = eng.create_time()
        try:
            while not self.done.is_set() and not self._due():
                if self.speed >= 1:
                    time.sleep(0.1)
                    continue
                eng.send_signal(signal.SIGSTOP)
                time.sleep(SLOW_PERIOD_S * (1 - self.speed))
                eng.send_signal(signal.SIGCONT)
                time.sleep(SLOW_PERIOD_S * self.speed)
        except psutil.Error:
            return
        try:
            while not self.done.is_set():
                eng.send_signal(signal.SIGSTOP)
                if self.onset_unix is None:
                    self.onset_unix = time.time()
                time.sleep(self.stopped_s)
                eng.send_signal(signal.SIGCONT)
                time.sleep(self.period_s - self.stopped_s)
        except psutil.Error:
            pass  # the engine is gone: the harness stopped it
        finally:
            with contextlib.suppress(psutil.Error):
                eng.send_signal(signal.SIGCONT)


def pause(eng: psutil.Process, seconds: float) -> float:
    """Freeze ``eng`` for ``seconds`` (a stall, a GC pause); the unix time it began."""
    t = time.time()
    eng.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        with contextlib.suppress(psutil.Error):
            eng.send_signal(signal.SIGCONT)
    return t
