"""The soak's health probe (harness/soak/health.py) on a simulated clock: a pause is read from the first ask it left
unanswered to its answer, whatever the soak's loop was doing, and never longer than it was."""

from __future__ import annotations

import threading
import time

import pytest

from harness.soak.health import HealthProbe

INTERVAL_S = 0.5
TIMEOUT_S = 5.0


class PausedEngine:
    """An engine frozen over [start, start + length) on a simulated clock: an ask waits until it answers or times
    out; answering otherwise takes ``latency_s``."""

    def __init__(self, start: float, length: float, latency_s: float = 0.01):
        self.now = 0.0
        self.start, self.end = start, start + length
        self.latency_s = latency_s

    def clock(self) -> float:
        return self.now

    def ask(self, timeout_s: float) -> bool:
        answer_at = (self.end if self.start <= self.now < self.end else self.now) + self.latency_s
        if answer_at - self.now > timeout_s:
            self.now += timeout_s
            return False
        self.now = answer_at
        return True


def _readings(engine: PausedEngine, until: float = 40.0) -> tuple[list[float], HealthProbe]:
    """Probe as the probe's thread does, one interval after each ask ends, until ``until``."""
    probe = HealthProbe(engine.ask, INTERVAL_S, TIMEOUT_S, clock=engine.clock)
    readings: list[float] = []
    while engine.now < until:
        engine.now += INTERVAL_S
        probe.probe_once()
        readings.extend(probe.take())
    return readings, probe


@pytest.mark.parametrize("pause_s", [2.0, 4.0, 8.0, 16.0])
@pytest.mark.parametrize("phase", [0.0, 0.13, 0.27, 0.49])
def test_a_pause_reads_at_most_one_interval_short_and_never_long(pause_s: float, phase: float) -> None:
    engine = PausedEngine(start=10.0 + phase, length=pause_s)
    readings, _ = _readings(engine)
    longest = max(readings)
    assert pause_s - INTERVAL_S <= longest <= pause_s + engine.latency_s + 1e-9, (pause_s, phase, readings)


def test_pauses_that_double_each_read_at_least_half_again_the_one_before() -> None:
    # the stall rule names a pause again when it is 1.5 times the longest named: doubling pauses always are
    read = []
    for pause_s in (4.0, 8.0, 16.0):
        for phase in (0.0, 0.25, 0.49):
            engine = PausedEngine(start=10.0 + phase, length=pause_s)
            read.append((pause_s, max(_readings(engine)[0])))
    for p1, r1 in read:
        for p2, r2 in read:
            if p2 == 2 * p1:
                assert r2 >= 1.5 * r1, (p1, r1, p2, r2)


def test_silence_counts_from_the_last_answer_and_a_restart_resets_it() -> None:
    engine = PausedEngine(start=5.0, length=100.0)
    probe = HealthProbe(engine.ask, INTERVAL_S, TIMEOUT_S, clock=engine.clock)
    while engine.now + INTERVAL_S < engine.start:
        engine.now += INTERVAL_S
        probe.probe_once()
    last_answer = engine.now
    while engine.now < 40.0:
        engine.now += INTERVAL_S
        probe.probe_once()
    assert probe.silent_s() == pytest.approx(engine.now - last_answer)
    # the timed-out asks are readings of their wait, never more than the timeout
    assert all(r <= TIMEOUT_S + 1e-9 for r in probe.take())
    probe.reset()
    assert probe.silent_s() == 0.0


def test_an_ask_that_raises_is_no_answer_and_the_probe_goes_on() -> None:
    now = [0.0]
    calls = []

    def ask(timeout_s: float) -> bool:
        calls.append(now[0])
        if len(calls) == 1:
            raise ValueError("a malformed answer")
        return True

    probe = HealthProbe(ask, INTERVAL_S, TIMEOUT_S, clock=lambda: now[0])
    probe.probe_once()
    now[0] = 1.0
    probe.probe_once()
    assert probe.take() == [0.0, 1.0]  # the failed ask's wait, then the silence since it
    assert probe.silent_s() == 0.0


def test_the_thread_asks_on_its_own_until_stopped() -> None:
    asked = threading.Event()
    count = [0]

    def ask(timeout_s: float) -> bool:
        count[0] += 1
        if count[0] >= 3:
            asked.set()
        return True

    probe = HealthProbe(ask, 0.02, TIMEOUT_S).start()
    try:
        assert asked.wait(5.0)
    finally:
        probe.stop()
    n = count[0]
    time.sleep(0.1)
    assert count[0] == n  # stopped
    assert len(probe.take()) >= 3


def test_a_pause_is_kept_as_its_span_of_wall_time_the_one_going_on_included() -> None:
    engine = PausedEngine(start=10.2, length=8.0)
    probe = HealthProbe(engine.ask, INTERVAL_S, TIMEOUT_S, clock=engine.clock, wall=lambda: 1000.0 + engine.now)
    while engine.now < 14.0:  # 3.8 s into the pause: the first ask timed out, the silence goes on
        engine.now += INTERVAL_S
        probe.probe_once()
    ((a, b),) = probe.pauses(3.0)
    # from the first ask it left unanswered (read short by at most one interval; each answer took 10 ms)
    assert 1010.2 - 0.1 <= a <= 1010.2 + INTERVAL_S + 0.1 and b == pytest.approx(1000.0 + engine.now)
    assert probe.pauses(6.0) == []  # not that long yet
    while engine.now < 30.0:
        engine.now += INTERVAL_S
        probe.probe_once()
    ((a2, b),) = probe.pauses(3.0)  # answered: one span, from the same ask to the answer
    assert a2 == pytest.approx(a) and b == pytest.approx(1018.2 + engine.latency_s)
    assert probe.pauses(8.5) == []
