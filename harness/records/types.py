"""Typed records of a soak: a watchdog verdict, a closed window, a failure as the observers hear it.

Each is a dataclass whose ``to_dict()`` is the JSON line the soak writes (verdicts.jsonl, windows.jsonl) or hands
the observers, and whose ``from_dict()`` reads any such line, older or newer: keys it does not name are kept in
``extra``, and a record read from a folder keeps its keys' order and writes back exactly the keys it had (a key
it lacked is not added as null). Schemas: docs/metrics.md#records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="JsonRecord")


@dataclass
class JsonRecord:
    """A JSON object with named fields; ``extra``: its other keys; ``order``: the key order it was read in (None:
    built in code, written in field order, then ``extra``)."""

    OWN: ClassVar[frozenset[str]] = frozenset({"extra", "order"})

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)
    order: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.OWN)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """The record of a JSON object; ValueError when a field without a default is missing."""
        names = cls.field_names()
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in cls.OWN and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [n for n in required if n not in data]
        if missing:
            raise ValueError(f"{cls.__name__}: no {', '.join(missing)}")
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra, order=tuple(data))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the keys read, in their order (then extras added since), or the fields then ``extra``."""
        names = self.field_names()
        if self.order is None:
            out = {n: getattr(self, n) for n in names}
        else:
            out = {}
            for k in self.order:
                if k in names:
                    out[k] = getattr(self, k)
                elif k in self.extra:
                    out[k] = self.extra[k]
        for k, v in self.extra.items():
            if k not in out and k not in names:
                out[k] = v
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A value by its JSON key (a field or an extra): for code that picks a series by name."""
        if key in self.field_names() and (self.order is None or key in self.order):
            return getattr(self, key)
        return self.extra.get(key, default)


@dataclass
class Verdict(JsonRecord):
    """A watchdog verdict: a line of verdicts.jsonl."""

    t_unix: float
    config: str
    slice: str | None
    kind: str  # crash, hang, collapse, recovered, memory, error_rate, drift, stall, disk, ... (harness/soak/slice.py)
    metric: str | None
    message: str
    evidence: dict[str, Any]
    action: str  # record, restart, retry, stop_config, stop_run
    engine_uptime_s: float | None = None
    engine_pid: int | None = None

    def failure(self, stage: str = "soak") -> Failure:
        """The verdict as the observers hear it as a failure of its configuration: its keys, then stage and time."""
        return Failure.from_dict({**self.to_dict(), "stage": stage, "unix_s": self.t_unix})


@dataclass
class Failure(JsonRecord):
    """A failure of a configuration: a line of failures.jsonl (the runner's: kind is the exception's class, and
    ``log`` its engine log, in ``extra``), or a soak verdict with its stage and time (``Verdict.failure``)."""

    config: str
    stage: str
    kind: str
    message: str
    unix_s: float


@dataclass
class SoakWindow(JsonRecord):
    """A closed, judged soak window: a line of windows.jsonl (harness/soak/assemble.py builds it). The named fields
    are those the watchdog's rules read; the rest (counters, CPU, the per-metric detector state, the open-loop
    backlog, the count-implied spreads, ...) stay in ``extra`` under their keys."""

    config: str
    slice: str
    t_start_unix: float
    t_end_unix: float
    t_unix: float
    engine_pid: int | None = None
    engine_uptime_s: float | None = None
    engine_restart: bool = False
    contaminated: bool = False
    requests: int = 0
    errors: int = 0
    output_tps: float | None = None
    decode_tps: float | None = None
    ttft_p95_s: float | None = None
    acceptance: float | None = None
    engine_rss_mib: float | None = None
    engine_anon_mib: float | None = None
    engine_memory_mib: float | None = None
    prompt_cache_mib: float | None = None
    prompt_cache_cap_mib: float | None = None
    machine_memory_available_mib: float | None = None
    gpu_used_mib: float | None = None
    gpu_total_mib: float | None = None
    probe_max_s: float | None = None
    max_chunk_gap_s: float | None = None
    users: int | None = None
    judged: bool = False
    not_judged_why: str | None = None
    memory_headroom_s: float | None = None
    memory_slope_mib_per_h: float | None = None
    gpu_headroom_s: float | None = None
    gpu_slope_mib_per_h: float | None = None
