"""The run's record files, each written durably before the observers hear of a record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.records.files import (
    FAILURES,
    FILL_CHECKS,
    PHASES,
    RAMP,
    REQUESTS,
    BatchedJsonlWriter,
    JsonlWriter,
    RequestRecord,
)
from harness.records.types import Failure, Phase
from harness.session.observers import Observers


class NotifyingWriter:
    """Write a record durably, then tell the observers (the disk always comes first)."""

    def __init__(self, writer: JsonlWriter, notify: Callable[[dict[str, Any]], None] | None):
        self.writer = writer
        self.notify = notify

    def write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        if self.notify is not None:  # None: the writer notifies once the record is on disk
            self.notify(record)

    def flush(self) -> None:
        if isinstance(self.writer, BatchedJsonlWriter):
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class PhaseWriter:
    """phases.jsonl or after_soak.jsonl: a phase written durably, then (``notify``) heard by the observers, typed once
    by the phase that measured it."""

    def __init__(self, writer: JsonlWriter, notify: Callable[[Phase], None] | None):
        self.writer = writer
        self.notify = notify

    def write(self, phase: Phase) -> None:
        self.writer.write(phase.to_dict())
        if self.notify is not None:
            self.notify(phase)

    def close(self) -> None:
        self.writer.close()


@dataclass
class RunOutputs:
    """requests.jsonl, phases.jsonl, failures.jsonl, ramp.jsonl and fill_checks.jsonl of one run folder."""

    requests: NotifyingWriter
    phases: PhaseWriter
    failures: NotifyingWriter
    ramp: JsonlWriter
    fill_checks: JsonlWriter

    @classmethod
    def open(cls, run_dir: Path, obs: Observers) -> RunOutputs:
        # request records go to disk in batches from a writer thread, observers hear of them once on disk; a phase
        # flushes them before its phase record (docs/performance.md#records-on-disk)
        # (the observers hear each line read back as its typed record)

        def on_request(line: dict[str, Any]) -> None:
            if obs.listening:  # typed only for a listener: one line per request measured
                obs.on_request(RequestRecord.from_dict(line))

        return cls(
            requests=NotifyingWriter(BatchedJsonlWriter(run_dir / REQUESTS, on_durable=on_request), None),
            phases=PhaseWriter(JsonlWriter(run_dir / PHASES), obs.on_phase),
            failures=NotifyingWriter(JsonlWriter(run_dir / FAILURES), lambda r: obs.on_failure(Failure.from_dict(r))),
            ramp=JsonlWriter(run_dir / RAMP),
            fill_checks=JsonlWriter(run_dir / FILL_CHECKS),
        )

    def close(self) -> None:
        for w in (self.requests, self.phases, self.failures, self.ramp, self.fill_checks):
            w.close()
