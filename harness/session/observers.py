"""Run observers: what else hears about a run as it happens (the Prometheus exporter, a soak watchdog).

The runner calls every observer after the record is already on disk, so an observer that fails
can never lose a sample; its exception is reported once and the observer is dropped.

Records reach observers as the JSON objects written to disk, never as the typed records: the soak passes
``SoakWindow.to_dict()``, ``Verdict.to_dict()`` and ``Verdict.failure().to_dict()`` (harness/records/types.py),
because the exporter reads them by key and ``specsoak`` replays a run folder's lines into the same methods.
"""

from __future__ import annotations

from typing import Any, Protocol


class RunObserver(Protocol):
    def on_run_start(self, manifest: dict[str, Any]) -> None: ...

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None: ...

    def on_capacity(self, config: str, capacity: dict[str, Any]) -> None: ...

    def on_request(self, record: dict[str, Any]) -> None: ...

    def on_phase(self, record: dict[str, Any]) -> None: ...

    def on_failure(self, record: dict[str, Any]) -> None: ...

    def on_window(self, record: dict[str, Any]) -> None: ...

    def on_verdict(self, record: dict[str, Any]) -> None: ...

    def on_canary(self, record: dict[str, Any]) -> None: ...

    def on_config_end(self, config: str, status: str) -> None: ...

    def on_run_end(self, status: str, reason: str) -> None: ...


class BaseObserver:
    """An observer that ignores everything; subclass and override what you need."""

    def on_run_start(self, manifest: dict[str, Any]) -> None:
        pass

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        pass

    def on_capacity(self, config: str, capacity: dict[str, Any]) -> None:
        pass

    def on_request(self, record: dict[str, Any]) -> None:
        pass

    def on_phase(self, record: dict[str, Any]) -> None:
        pass

    def on_failure(self, record: dict[str, Any]) -> None:
        """A failure of a configuration (harness/records/types.py ``Failure``): a line of failures.jsonl, or a soak verdict
        of a failing kind with its stage and time."""

    def on_window(self, record: dict[str, Any]) -> None:
        """A closed soak window (a line of windows.jsonl, already on disk: harness/records/types.py ``SoakWindow``): its
        aggregates, the engine counter deltas, CPU split and the change detector's state per watched metric."""

    def on_verdict(self, record: dict[str, Any]) -> None:
        """A watchdog verdict (a line of verdicts.jsonl: harness/records/types.py ``Verdict``)."""

    def on_canary(self, record: dict[str, Any]) -> None:
        """A finished output-canary round of a soak (harness/soak/canary.py ``Canary.summary``)."""

    def on_config_end(self, config: str, status: str) -> None:
        pass

    def on_run_end(self, status: str, reason: str) -> None:
        pass


class Observers:
    """Fan-out to many observers; a failing observer is reported and dropped, never fatal."""

    def __init__(self, observers: list[RunObserver] | None = None, warn: Any = None):
        self._obs = list(observers or [])
        self._warn = warn or (lambda msg: None)

    def _each(self, name: str, *args: Any) -> None:
        for obs in list(self._obs):
            try:
                getattr(obs, name)(*args)
            except Exception as exc:
                self._warn(f"observer {type(obs).__name__}.{name} failed and is dropped: {exc}")
                self._obs.remove(obs)

    def on_run_start(self, manifest: dict[str, Any]) -> None:
        self._each("on_run_start", manifest)

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        self._each("on_config_start", config, algorithm, synthetic, engine, engine_url, engine_pid)

    def on_capacity(self, config: str, capacity: dict[str, Any]) -> None:
        self._each("on_capacity", config, capacity)

    def on_request(self, record: dict[str, Any]) -> None:
        self._each("on_request", record)

    def on_phase(self, record: dict[str, Any]) -> None:
        self._each("on_phase", record)

    def on_failure(self, record: dict[str, Any]) -> None:
        self._each("on_failure", record)

    def on_window(self, record: dict[str, Any]) -> None:
        self._each("on_window", record)

    def on_verdict(self, record: dict[str, Any]) -> None:
        self._each("on_verdict", record)

    def on_canary(self, record: dict[str, Any]) -> None:
        self._each("on_canary", record)

    def on_config_end(self, config: str, status: str) -> None:
        self._each("on_config_end", config, status)

    def on_run_end(self, status: str, reason: str) -> None:
        self._each("on_run_end", status, reason)
