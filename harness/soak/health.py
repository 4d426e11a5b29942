"""The engine's health probe on a thread of its own: asked every ``interval_s`` whatever the soak's loop is doing, so
the silence it measures is the engine's, not the time the loop spent closing a window (counted from the loop's last
answer, a pause read longer by however long the loop was busy: on CI, stop 30, an 8-s SIGSTOP after a 4-s one was not
named as grown)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

PAUSE_MIN_S = 1.0  # silences this long or longer are kept as spans (a healthy engine answers in milliseconds)
PAUSES_KEPT = 4096  # the most recent of them: a window is judged one window after it closes


class HealthProbe:
    """``ask(timeout_s)`` is True when the engine answered healthy. Each answer records the engine's silence: from the
    first ask still unanswered (a timed-out or failed one) to this answer, else this ask's own wait; a failed ask
    records its wait (at most ``timeout_s``). A pause is read short by at most one interval, never long. Each answered
    silence is also kept as a span of wall-clock time (``pauses``), so that every window it overlapped can say so, not
    only the one its answer fell in."""

    def __init__(
        self,
        ask: Callable[[float], bool],
        interval_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self._ask = ask
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._readings: list[float] = []
        self._spans: deque[tuple[float, float]] = deque(maxlen=PAUSES_KEPT)
        self._last_ok = clock()
        self._asked_since: float | None = None  # when the first ask still unanswered was sent
        self._in_flight: float | None = None  # when the ask now waiting was sent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HealthProbe:
        self.reset()
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)

    def reset(self) -> None:
        """A new engine (a restart): its silence counts from now."""
        with self._lock:
            self._last_ok, self._asked_since = self._clock(), None

    def silent_s(self) -> float:
        """Seconds since the engine last answered healthy."""
        with self._lock:
            return self._clock() - self._last_ok

    def pauses(self, floor_s: float) -> list[tuple[float, float]]:
        """The engine's silences of at least ``floor_s`` (and PAUSE_MIN_S) as (start, end) in wall-clock seconds, the
        one still going on included (ending now)."""
        with self._lock:
            spans = [sp for sp in self._spans if sp[1] - sp[0] >= floor_s]
            since = self._asked_since if self._asked_since is not None else self._in_flight
            if since is not None and (silent := self._clock() - since) >= max(floor_s, PAUSE_MIN_S):
                now = self._wall()
                spans.append((now - silent, now))
        return spans

    def take(self) -> list[float]:
        """The readings since the last call (the window that closes), seconds."""
        with self._lock:
            out, self._readings = self._readings, []
        return out

    def probe_once(self) -> None:
        t0 = self._clock()
        with self._lock:
            self._in_flight = t0
        try:
            ok = self._ask(self.timeout_s)
        except Exception:  # any failed ask is no answer; the thread must not die and leave a silence that is its own
            ok = False
        t1 = self._clock()
        with self._lock:
            self._in_flight = None
            if ok:
                since = self._asked_since if self._asked_since is not None else t0
                self._readings.append(t1 - since)
                if t1 - since >= PAUSE_MIN_S:
                    end = self._wall()
                    self._spans.append((end - (t1 - since), end))
                self._asked_since, self._last_ok = None, t1
            else:
                self._readings.append(min(self.timeout_s, t1 - t0))
                if self._asked_since is None:
                    self._asked_since = t0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.probe_once()
