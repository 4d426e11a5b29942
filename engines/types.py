"""The harness's engine-neutral values: what a configuration asks of an engine (``LaunchSpec``), what its
start-up log reveals (``Capacity``), what its /metrics counts (``EngineCounters``) and their arithmetic, plus the
guards the adapters read engine figures through. Definitions of every figure: docs/metrics.md.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engines.logcapture import DEFAULT_LOG_MAX_MIB


@dataclass(frozen=True)
class LaunchSpec:
    """What one configuration asks of an engine, engine-neutral."""

    model: Path
    algorithm: str = "none"
    draft: Path | None = None
    k: int | None = None
    k_min: int | None = None
    synthetic_length: float | None = None
    synthetic_rates: tuple[float, ...] | None = None
    ctx_size: int = 8192
    parallel: int = 4
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    binary: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    # where the harness sends requests when not to the engine itself (a proxy in between; tests/faults)
    request_base_url: str | None = None
    # the engine's API key, read from the environment variable the scenario names; never shown or stored
    api_key: str | None = field(default=None, repr=False)
    # the scenario's server.env: environment of the engine process (vLLM's VLLM_CPU_KVCACHE_SPACE, ...)
    env: tuple[tuple[str, str], ...] = ()
    # attach mode (server.url): a server specsoak did not start; never launched, restarted or stopped
    attach_url: str | None = None
    metrics_url: str | None = None  # its /metrics elsewhere (default: the server's own metrics path)
    attach_log: Path | None = None  # its log, where the capacity lines are (default: none)
    log_max_mib: float = (
        DEFAULT_LOG_MAX_MIB  # the engine log's bound on disk (report.engine_log_max_mib; engines/logcapture.py)
    )

    @property
    def attached(self) -> bool:
        return self.attach_url is not None

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"


@dataclass(frozen=True)
class MemoryUse:
    """Memory one model context reserves, in MiB, as the engine's start-up log reports it."""

    model_mib: float | None = None
    kv_mib: float | None = None
    compute_mib: float | None = None
    recurrent_mib: float | None = None
    recurrent_cells: int | None = None
    kv_cells: int | None = None
    layers: int | None = None

    @property
    def total_mib(self) -> float | None:
        parts = [self.model_mib, self.kv_mib, self.compute_mib, self.recurrent_mib]
        if all(p is None for p in parts):
            return None
        return sum(p or 0.0 for p in parts)


@dataclass(frozen=True)
class Capacity:
    """What the start-up log reveals: the only truth about parallelism (docs/metrics.md#capacity)."""

    slots: int | None = None
    ctx_per_slot: int | None = None
    ctx_total: int | None = None
    kv_unified: bool | None = None
    target: MemoryUse = field(default_factory=MemoryUse)
    draft: MemoryUse | None = None
    spec_types: tuple[str, ...] = ()
    spec_n_max: int | None = None
    synthetic: str | None = None
    model_file_mib: float | None = None
    model_params_m: float | None = None
    cpu_features: tuple[str, ...] = ()
    threads: int | None = None
    fatal: tuple[str, ...] = ()
    memory_lines_seen: bool = False
    # paged-KV engines (vLLM, SGLang, TRT-LLM, TGI): ctx_total is the KV pool in tokens, shared by all
    # requests; max_concurrency is the engine's own "requests of ctx_per_slot tokens that fit" figure
    max_concurrency: float | None = None
    kv_blocks: int | None = None
    kv_block_tokens: int | None = None
    # a host-memory prompt cache that grows with distinct prompts up to this cap (llama-server --cache-ram)
    prompt_cache_cap_mib: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def recognised(self) -> bool:
        """Whether the log held any start-up line the parser knows (an all-empty capacity: nothing was)."""
        return bool(
            self.slots is not None
            or self.ctx_per_slot is not None
            or self.ctx_total is not None
            or self.memory_lines_seen
            or self.spec_types
            or self.fatal
            or self.model_file_mib is not None
            or self.model_params_m is not None
            or self.max_concurrency is not None
            or self.kv_blocks is not None
            or self.threads is not None
            or self.target.kv_mib is not None
            or self.target.model_mib is not None
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capacity:
        """A capacity record read back (capacity/CONFIG.json): the keys it does not name (config, ready_s) left out."""
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["target"] = MemoryUse(**d.get("target") or {})
        d["draft"] = MemoryUse(**d["draft"]) if d.get("draft") else None
        for key in ("spec_types", "cpu_features", "fatal", "notes"):
            d[key] = tuple(d.get(key) or ())
        return cls(**d)


@dataclass(frozen=True)
class EngineCounters:
    """Engine counters from one /metrics scrape, in the harness's names (cumulative totals)."""

    prompt_tokens: float | None = None
    output_tokens: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    verify_steps: float | None = None
    accepted_per_position: tuple[float, ...] = ()
    requests_processing: float | None = None  # gauge: requests being decoded (llama.cpp: busy slots)
    requests_deferred: float | None = None  # gauge: requests waiting for a slot or KV blocks
    kv_usage: float | None = None  # gauge: share of the KV cache in use, 0 to 1
    preemptions: float | None = None  # requests preempted (swapped or recomputed) for lack of KV
    prefix_cache_queries: float | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # of those, tokens found there
    requests_finished: float | None = None  # requests the engine finished, any reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def counters_delta(before: EngineCounters, after: EngineCounters) -> EngineCounters:
    """after - before for every counter both scrapes have (gauges are taken from ``after``)."""

    def d(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    n = max(len(before.accepted_per_position), len(after.accepted_per_position))
    bp = before.accepted_per_position + (0.0,) * (n - len(before.accepted_per_position))
    ap = after.accepted_per_position + (0.0,) * (n - len(after.accepted_per_position))
    return EngineCounters(
        prompt_tokens=d(after.prompt_tokens, before.prompt_tokens),
        output_tokens=d(after.output_tokens, before.output_tokens),
        draft_tokens=d(after.draft_tokens, before.draft_tokens),
        accepted_tokens=d(after.accepted_tokens, before.accepted_tokens),
        verify_steps=d(after.verify_steps, before.verify_steps),
        accepted_per_position=tuple(a - b for a, b in zip(ap, bp, strict=True)),
        requests_processing=after.requests_processing,
        requests_deferred=after.requests_deferred,
        kv_usage=after.kv_usage,
        preemptions=d(after.preemptions, before.preemptions),
        prefix_cache_queries=d(after.prefix_cache_queries, before.prefix_cache_queries),
        prefix_cache_hits=d(after.prefix_cache_hits, before.prefix_cache_hits),
        requests_finished=d(after.requests_finished, before.requests_finished),
    )


def prefix_hit_rate(delta: EngineCounters) -> float | None:
    """Prompt tokens found in the prefix cache over those looked up, in a counter delta (None: none looked up)."""
    q, h = delta.prefix_cache_queries, delta.prefix_cache_hits
    return h / q if q and h is not None and q > 0 else None


def acceptance_figures(delta: EngineCounters) -> dict[str, Any]:
    """Acceptance rate, mean acceptance length (bonus token included) and per-position rates of a
    counter delta: the one definition every stage uses (docs/metrics.md)."""
    drafted, accepted, steps = delta.draft_tokens, delta.accepted_tokens, delta.verify_steps
    out: dict[str, Any] = {"acceptance": None, "mean_accept_len": None, "per_position": []}
    if drafted and accepted is not None:
        out["acceptance"] = accepted / drafted
    if steps and accepted is not None:
        out["mean_accept_len"] = 1.0 + accepted / steps
        out["per_position"] = [p / steps for p in delta.accepted_per_position]
    return out


@dataclass(frozen=True)
class CacheState:
    """A host prompt cache's size as the engine last logged it."""

    prompts: int
    size_mib: float
    cap_mib: float | None  # None: no limit


@dataclass(frozen=True)
class RequestSpecStats:
    """Per-request speculative counts, when the engine returns them with the response."""

    draft_tokens: int | None = None
    accepted_tokens: int | None = None


_HUGE_NUMBER = re.compile(r"\d{31}")


def startup_lines(text: str) -> list[str]:
    """The lines of a start-up log that the parsers read figures from: a line holding a number of more
    than 30 digits is left out (no start-up figure has one; int() refuses 4300 digits, and a ratio of
    two 310-digit numbers overflows a float)."""
    return [ln for ln in text.splitlines() if not _HUGE_NUMBER.search(ln)]


def spec_count(value: Any) -> int | None:
    """A per-request count from an engine's answer (12, 12.0, "12") as an int; None when it is not one
    (a word, a list, NaN, a number beyond 64 bits): the engine's answer is data, never a crash."""
    if value is None or isinstance(value, bool):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if -(2**63) <= n < 2**63 else None
