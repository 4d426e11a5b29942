"""Run observers: what else hears about a run as it happens (the Prometheus exporter, a soak watchdog).

The runner calls every observer after the record is already on disk, so an observer that fails
can never lose a sample; its exception is reported once and the observer is dropped.

Observers hear the typed records (harness/records/types.py; ``RequestRecord`` in harness/records/files.py) the run
writes, and ``specsoak export`` replays a run folder's lines, read back into the same types, into the same methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engines.types import Capacity
from harness.records.files import RequestRecord
from harness.records.types import CanaryRound, Failure, Manifest, Phase, SoakWindow, Verdict


class RunObserver(Protocol):
    def on_run_start(self, manifest: Manifest) -> None: ...

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None: ...

    def on_capacity(self, config: str, capacity: Capacity, ready_s: float | None) -> None: ...

    def on_request(self, record: RequestRecord) -> None: ...

    def on_phase(self, record: Phase) -> None: ...

    def on_failure(self, record: Failure) -> None: ...

    def on_window(self, record: SoakWindow) -> None: ...

    def on_verdict(self, record: Verdict) -> None: ...

    def on_canary(self, record: CanaryRound) -> None: ...

    def on_config_end(self, config: str, status: str) -> None: ...

    def on_run_end(self, status: str, reason: str) -> None: ...


class BaseObserver:
    """An observer that ignores everything; subclass and override what you need."""

    def on_run_start(self, manifest: Manifest) -> None:
        pass

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        pass

    def on_capacity(self, config: str, capacity: Capacity, ready_s: float | None) -> None:
        """What the engine's start-up log revealed, and how long it took to be ready (None: not measured)."""

    def on_request(self, record: RequestRecord) -> None:
        pass

    def on_phase(self, record: Phase) -> None:
        pass

    def on_failure(self, record: Failure) -> None:
        """A failure of a configuration: a line of failures.jsonl, or a soak verdict of a failing kind with its stage
        and time (``Verdict.failure``)."""

    def on_window(self, record: SoakWindow) -> None:
        """A closed soak window (a line of windows.jsonl, already on disk): its aggregates, the engine counter deltas,
        CPU split and the change detector's state per watched metric."""

    def on_verdict(self, record: Verdict) -> None:
        """A watchdog verdict (a line of verdicts.jsonl)."""

    def on_canary(self, record: CanaryRound) -> None:
        """A finished output-canary round of a soak."""

    def on_config_end(self, config: str, status: str) -> None:
        pass

    def on_run_end(self, status: str, reason: str) -> None:
        pass


class Observers:
    """Fan-out to many observers; a failing observer is reported and dropped, never fatal."""

    def __init__(self, observers: list[RunObserver] | None = None, warn: Callable[[str], None] | None = None):
        self._obs = list(observers or [])
        self._warn = warn or (lambda msg: None)

    @property
    def listening(self) -> bool:
        """Whether any observer is left to hear a record (none: no record need be typed for them)."""
        return bool(self._obs)

    def _each(self, call: Callable[[RunObserver], Any], name: str) -> None:
        for obs in list(self._obs):
            try:
                call(obs)
            except Exception as exc:
                self._warn(f"observer {type(obs).__name__}.{name} failed and is dropped: {exc}")
                self._obs.remove(obs)

    def on_run_start(self, manifest: Manifest) -> None:
        self._each(lambda o: o.on_run_start(manifest), "on_run_start")

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        self._each(
            lambda o: o.on_config_start(config, algorithm, synthetic, engine, engine_url, engine_pid), "on_config_start"
        )

    def on_capacity(self, config: str, capacity: Capacity, ready_s: float | None) -> None:
        self._each(lambda o: o.on_capacity(config, capacity, ready_s), "on_capacity")

    def on_request(self, record: RequestRecord) -> None:
        self._each(lambda o: o.on_request(record), "on_request")

    def on_phase(self, record: Phase) -> None:
        self._each(lambda o: o.on_phase(record), "on_phase")

    def on_failure(self, record: Failure) -> None:
        self._each(lambda o: o.on_failure(record), "on_failure")

    def on_window(self, record: SoakWindow) -> None:
        self._each(lambda o: o.on_window(record), "on_window")

    def on_verdict(self, record: Verdict) -> None:
        self._each(lambda o: o.on_verdict(record), "on_verdict")

    def on_canary(self, record: CanaryRound) -> None:
        self._each(lambda o: o.on_canary(record), "on_canary")

    def on_config_end(self, config: str, status: str) -> None:
        self._each(lambda o: o.on_config_end(config, status), "on_config_end")

    def on_run_end(self, status: str, reason: str) -> None:
        self._each(lambda o: o.on_run_end(status, reason), "on_run_end")
