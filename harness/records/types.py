"""Typed records of a run: the manifest, a measured phase, a soak window, a watchdog verdict, a failure, a canary round.

Each is a dataclass whose ``to_dict()`` is the JSON the run writes (manifest.json, phases.jsonl, windows.jsonl,
verdicts.jsonl, failures.jsonl) and whose ``from_dict()`` reads any such object, older or newer: keys it does not
name are kept in ``extra``, and a record read from a folder keeps its keys' order and writes back exactly the keys it
had (a key it lacked is not added as null). The observers (harness/session/observers.py) hear these records.
Schemas: docs/metrics.md (per request, per phase, soak).
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
        """The JSON object: the keys read, in their order (then fields and extras set since), or the fields then
        ``extra``."""
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
            for f in dataclasses.fields(self):  # a field the object lacked, set since: written after the others
                if f.name in names and f.name not in out and getattr(self, f.name) != _default(f):
                    out[f.name] = getattr(self, f.name)
        for k, v in self.extra.items():
            if k not in out and k not in names:
                out[k] = v
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A value by its JSON key (a field or an extra): for code that picks a series by name."""
        fields = self.__dataclass_fields__
        if key in fields and key not in self.OWN:
            value = getattr(self, key)
            if self.order is None or key in self.order or value != _default(fields[key]):
                return value
            return default
        return self.extra.get(key, default)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


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
    speed_index: float | None = None  # tokens streamed over what the engine streams at the concurrency they had
    # the change detector's reference for the index until it has its own (1 once the curve is known, else None)
    speed_index_prior: float | None = None
    # the first tokens' service (TTFT less the wait for a slot) predicted over measured (harness/soak/prefill.py), and
    # its prior reference
    prefill_index: float | None = None
    prefill_index_prior: float | None = None
    engine_rss_mib: float | None = None
    engine_anon_mib: float | None = None
    engine_memory_mib: float | None = None
    prompt_cache_mib: float | None = None
    prompt_cache_cap_mib: float | None = None
    machine_memory_available_mib: float | None = None
    gpu_used_mib: float | None = None
    gpu_total_mib: float | None = None
    probe_max_s: float | None = None
    paused_s: float = 0.0  # seconds of the window the engine was silent at least the stall floor (a pause in it)
    max_chunk_gap_s: float | None = None
    users: int | None = None
    judged: bool = False
    not_judged_why: str | None = None
    memory_headroom_s: float | None = None
    memory_slope_mib_per_h: float | None = None
    gpu_headroom_s: float | None = None
    gpu_slope_mib_per_h: float | None = None


@dataclass
class Phase(JsonRecord):
    """A measured phase: a line of phases.jsonl or after_soak.jsonl (harness/run/phases.py builds it). The named fields
    are those the runner, the resume and the exporter read; the acceptance figures, GPU sample, SLO and open-loop
    figures stay in ``extra`` under their keys."""

    config: str
    phase: str  # warmup, measure, arrivals, after_soak or ramp
    streams: int
    repetition: int
    attempt: str | None = None
    algorithm: str | None = None
    synthetic: bool = False
    k: int | None = None
    start_unix_s: float | None = None
    end_unix_s: float | None = None
    wall_s: float | None = None
    requests: int = 0
    ok: int = 0
    errors: int = 0
    output_tokens: int = 0
    total_tps: float | None = None
    median_decode_tps: float | None = None
    cpu: dict[str, Any] = field(default_factory=dict)  # harness/probe/cpu.py CpuUse.to_dict()
    engine_uptime_s: float | None = None
    contaminated: bool = False
    counters: dict[str, Any] = field(default_factory=dict)  # the engine's counter deltas over the phase
    load: str | None = None  # open-loop phases: the arrival key (measurement.arrival)

    @property
    def load_key(self) -> int | str:
        """What the phase measured: its open-loop arrival key, else its stream count (the resume's key)."""
        return self.load if isinstance(self.load, str) else self.streams


@dataclass
class ConfigState(JsonRecord):
    """One configuration in the manifest: what it is, and where the run got with it (``status``: pending, starting,
    running, done, failed). The runner adds what it learns (command, engine_exit, fill_check, sweep_skipped, ...) to
    ``extra``."""

    status: str = "pending"
    algorithm: str | None = None
    synthetic: bool = False
    k: int | None = None
    sweep_of: str | None = None
    model: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)  # the configuration as the scenario gave it

    def update(self, **fields: Any) -> None:
        """Set fields by name, the named ones as attributes and the others in ``extra``."""
        names = self.field_names()
        for k, v in fields.items():
            if k in names:
                setattr(self, k, v)
            else:
                self.extra[k] = v


@dataclass
class VerifyState(JsonRecord):
    """A ``specsoak verify`` comparison in a manifest (its ``verify`` key: a verify run's own, or one added to a run
    it was pointed at with ``--into``): what was compared, and how it ended."""

    started_unix: float | None = None
    streams: int | None = None
    prompts: list[str] = field(default_factory=list)  # prompt ids
    max_tokens: int | None = None
    seed: int | None = None
    status: str | None = None  # running, completed, failed
    stopped_unix: float | None = None
    all_identical: bool | None = None
    reason: str | None = None  # why it failed


@dataclass
class Manifest(JsonRecord):
    """A run folder's manifest.json (harness/run/manifest.py writes it): the scenario, the engine, the machine, each
    configuration's state, and how the run stopped."""

    run_id: str = ""  # the run folder's name
    specsoak_version: str | None = None
    kind: str | None = None  # "verify" for a verify run's own folder; absent for a run
    scenario: str | None = None
    scenario_file: str | None = None  # the scenario's path when the run started
    engine: str | None = None
    engine_version: str | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    started_unix: float | None = None
    stopped_unix: float | None = None
    status: str | None = None  # running, done, failed, interrupted, ...
    stop_reason: str | None = None
    scenario_parsed: dict[str, Any] = field(default_factory=dict)  # the scenario as the schema read it
    design: dict[str, Any] = field(default_factory=dict)
    part: dict[str, Any] | None = None  # a campaign's part (--no-soak, --soak-config): harness/config/parts.py
    configurations: dict[str, ConfigState] = field(default_factory=dict)
    verify: VerifyState | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        configs, verify = data.get("configurations"), data.get("verify")
        if configs is not None and not isinstance(configs, dict):
            raise ValueError("Manifest: configurations is not an object")
        if verify is not None and not isinstance(verify, dict):
            raise ValueError("Manifest: verify is not an object")
        m = super().from_dict(
            {
                **data,
                "configurations": {n: ConfigState.from_dict(dict(c or {})) for n, c in (configs or {}).items()},
                "verify": VerifyState.from_dict(verify) if verify is not None else None,
            }
        )
        # an old manifest without the keys writes back without them
        m.order = tuple(k for k in m.order or () if k in data)
        return m

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if "configurations" in out:
            out["configurations"] = {n: c.to_dict() for n, c in self.configurations.items()}
        if self.verify is not None:
            out["verify"] = self.verify.to_dict()
        return out


@dataclass
class CanaryRound(JsonRecord):
    """A finished output-canary round of a soak, in figures (harness/soak/canary.py ``Canary.summary`` and
    ``round_summaries``): answers, errors, how many differ from each reference (None: no reference yet)."""

    config: str
    slice: str | None
    round: int
    t_unix: float
    answers: int = 0
    errors: int = 0
    differing_first: int | None = None
    differing_baseline: int | None = None
    baseline: str | None = None  # the baseline configuration the answers were compared with
    diverged: bool = False  # a divergence verdict of the configuration precedes the round's end
    error: str | None = None  # the first refused answer's error
