"""The live Prometheus exporter: a run observer that turns records into metrics and serves /metrics.

It owns its own ``CollectorRegistry`` (never the global one) and binds 127.0.0.1 unless told
otherwise. Every figure follows docs/metrics.md; every name is listed in docs/observability.md.

Labels are bounded: ``run``, ``config``, ``engine``, ``algorithm``, ``synthetic`` on everything
per configuration, plus ``phase`` (warmup|measure|ramp|soak), ``streams`` (the scenario's stream counts),
``status``/``error_kind`` (docs/metrics.md's fixed list), ``position`` (capped at MAX_POSITIONS),
``role``/``buffer`` (target|draft x model|kv|compute|recurrent), ``kind``/``stage`` of a failed
configuration, ``kind`` of a watchdog verdict (VERDICT_KINDS, anything else is "other"), ``metric``
of the soak's change detector and of a verdict (WATCHED_METRICS, "" when a verdict names none,
"other"), and ``kind`` (total|available) of the machine's memory. Nothing is labelled per request
or per prompt.

Soak windows (``on_window``) set gauges that describe the soak *now*: a figure the window does not
have (None) removes its series rather than exporting 0, so a panel shows a gap and an alert does not
fire on a stale value; ``on_config_end`` removes them all (no engine, no soak state). The window's
engine counter deltas are added to the same drafted/accepted/verify-step counters as measured phases.

The same class replays a finished run folder (harness/metrics/openmetrics.py): pass ``clock`` and
no process reader, and the engine is "up" from its start to its end.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from engines.types import Capacity
from harness.config.policy import RECORDED_VERDICT_KINDS
from harness.detect.changepoint import WATCHED_CHANGES
from harness.probe.memory import rss_bytes
from harness.records.files import RequestRecord
from harness.records.types import CanaryRound, Failure, Manifest, Phase, SoakWindow, Verdict
from harness.session.observers import BaseObserver
from harness.soak.coverage import has_traffic

CONFIG_LABELS = ("run", "config", "engine", "algorithm", "synthetic")
MAX_POSITIONS = 16  # per-position acceptance beyond this many drafted tokens is not exported
# watchdog verdict kinds (harness/config/policy.py); an unknown kind is exported as "other"
VERDICT_KINDS = (*RECORDED_VERDICT_KINDS, "other")
MIB = 1024 * 1024


class WindowGauge(NamedTuple):
    """A gauge per configuration set from each closed soak window: ``value(window, now)``, None for no series."""

    name: str
    help: str
    value: Callable[[SoakWindow, float], float | None]


def _field(key: str, scale: float = 1.0) -> Callable[[SoakWindow, float], float | None]:
    return lambda w, _now: _times(w.get(key), scale)


def _cpu(key: str) -> Callable[[SoakWindow, float], float | None]:
    return lambda w, _now: _times((w.get("cpu") or {}).get(key), 1.0)


def _headroom(prefix: str) -> Callable[[SoakWindow, float], float | None]:
    def value(w: SoakWindow, _now: float) -> float | None:
        if (v := w.get(f"{prefix}_headroom_s")) is not None:
            return float(v)
        return math.inf if w.get(f"{prefix}_slope_mib_per_h") is not None else None

    return value


def _judged(w: SoakWindow, _now: float) -> float | None:
    return None if (judged := w.get("judged")) is None else float(bool(judged))


def _window_end(w: SoakWindow, now: float) -> float | None:
    return float(w.t_end_unix or now)


def _max_delay(w: SoakWindow, _now: float) -> float | None:
    return _times(w.get("max_send_delay_s"), 1.0) if w.get("late") is not None else None


# the soak window's figures, one gauge each, in docs/observability.md; the last window's, removed at the configuration's end
WINDOW_GAUGES: tuple[WindowGauge, ...] = (
    WindowGauge(
        "specsoak_soak_output_tokens_per_second",
        "output tokens of requests finished in the last soak window / its seconds",
        _field("output_tps"),
    ),
    WindowGauge(
        "specsoak_soak_decode_tokens_per_second",
        "median per-request decode t/s of the last soak window",
        _field("decode_tps"),
    ),
    WindowGauge(
        "specsoak_soak_speed_index",
        "tokens the last soak window's requests streamed / what the engine's learned curve gives at their concurrency",
        _field("speed_index"),
    ),
    WindowGauge(
        "specsoak_soak_prefill_index",
        "the last soak window's first-token service (TTFT less the wait for a slot) the engine's prefill model "
        "predicts / what it took",
        _field("prefill_index"),
    ),
    WindowGauge(
        "specsoak_soak_ttft_p95_seconds",
        "p95 TTFT of the last soak window",
        _field("ttft_p95_s"),
    ),
    WindowGauge(
        "specsoak_soak_error_ratio",
        "failed / all requests of the last soak window",
        _field("error_ratio"),
    ),
    WindowGauge(
        "specsoak_soak_acceptance_ratio",
        "accepted / drafted tokens over the last soak window (engine counters)",
        _field("acceptance"),
    ),
    WindowGauge(
        "specsoak_soak_mean_acceptance_length",
        "1 + accepted / verification steps over the last soak window",
        _field("mean_accept_len"),
    ),
    WindowGauge(
        "specsoak_soak_engine_memory_bytes",
        "resident memory of the engine's process tree at the end of the last soak window",
        _field("engine_rss_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_users",
        "offered load (Locust users) of the last soak window",
        _field("users"),
    ),
    WindowGauge(
        "specsoak_engine_uptime_seconds",
        "seconds since the soak engine's process started, at the end of the last window",
        _field("engine_uptime_s"),
    ),
    # +Inf when the forecast sees no growth, absent before there is a forecast: never the last value, since a
    # stale short headroom would keep SpecsoakMemoryExhaustion firing after the growth stopped
    WindowGauge(
        "specsoak_soak_memory_headroom_seconds",
        "seconds until the machine's available memory is used up at the engine's memory slope "
        "(+Inf when not growing, absent before the first forecast)",
        _headroom("memory"),
    ),
    WindowGauge(
        "specsoak_soak_gpu_memory_headroom_seconds",
        "seconds until the GPUs' free memory is used up at the used memory's slope "
        "(+Inf when not growing, absent before the first forecast or without a GPU)",
        _headroom("gpu"),
    ),
    WindowGauge(
        "specsoak_harness_resident_memory_bytes",
        "resident memory of the harness and its Locust processes at the end of the last soak window",
        _field("harness_rss_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_engine_cpu_cores",
        "CPU cores used by the engine process tree during the last soak window",
        _cpu("engine_cores"),
    ),
    WindowGauge(
        "specsoak_soak_harness_cpu_cores",
        "CPU cores used by the harness and its Locust processes during the last soak window",
        _cpu("harness_cores"),
    ),
    WindowGauge(
        "specsoak_soak_other_cpu_cores",
        "CPU cores used by other processes during the last soak window (contamination)",
        _cpu("other_cores"),
    ),
    WindowGauge(
        "specsoak_soak_window_judged",
        "1 if the watchdog judged the last soak window, 0 if not (too few requests, contaminated, warm-up)",
        _judged,
    ),
    WindowGauge(
        "specsoak_soak_window_end_time_seconds",
        "Unix time the last soak window closed",
        _window_end,
    ),
    WindowGauge(
        "specsoak_soak_achieved_requests_per_second",
        "successful requests finished in the last soak window / its seconds",
        _field("achieved_rps"),
    ),
    WindowGauge(
        "specsoak_soak_goodput_requests_per_second",
        "requests of the last soak window that met the scenario's SLO (TTFT, per-token, end-to-end; "
        "from their scheduled time) / its seconds; absent without a per-request SLO",
        _field("goodput_rps"),
    ),
    WindowGauge(
        "specsoak_soak_offered_requests_per_second",
        "open-loop soak: arrivals scheduled in the last window / its seconds",
        _field("offered_rps"),
    ),
    WindowGauge(
        "specsoak_soak_asked_requests_per_second",
        "open-loop soak: the mean rate the scenario's rate curve asks over the last window",
        _field("asked_rps"),
    ),
    WindowGauge(
        "specsoak_soak_late_requests",
        "open-loop soak: requests of the last window sent late (waited for max_in_flight, or the client lagged)",
        _field("late"),
    ),
    WindowGauge(
        "specsoak_soak_max_send_delay_seconds",
        "open-loop soak: the longest send delay (send time - scheduled time) among the last window's requests",
        _max_delay,
    ),
    WindowGauge(
        "specsoak_soak_longest_chunk_gap_seconds",
        "the longest gap between two chunks of any request of the last soak window",
        _field("max_chunk_gap_s"),
    ),
    WindowGauge(
        "specsoak_soak_chunk_gap_p99_seconds",
        "p99 of every gap between two chunks in the last soak window",
        _field("itl_p99_s"),
    ),
    WindowGauge(
        "specsoak_soak_probe_max_seconds",
        "the longest the health probe went without an answer in the last soak window "
        "(slowest probe, or the stretch between two healthy answers less the probe interval)",
        _field("probe_max_s"),
    ),
    WindowGauge(
        "specsoak_soak_engine_requests_running",
        "requests the engine was decoding at the end of the last soak window (its /metrics)",
        _field("requests_running"),
    ),
    WindowGauge(
        "specsoak_soak_engine_requests_waiting",
        "requests waiting in the engine's queue at the end of the last soak window (its /metrics)",
        _field("requests_waiting"),
    ),
    WindowGauge(
        "specsoak_soak_engine_kv_usage_ratio",
        "share of the engine's KV cache in use at the end of the last soak window (vLLM)",
        _field("kv_usage"),
    ),
    WindowGauge(
        "specsoak_soak_engine_preemptions",
        "requests the engine preempted during the last soak window (vLLM)",
        _field("preemptions"),
    ),
    WindowGauge(
        "specsoak_soak_prefix_cache_hit_ratio",
        "prompt tokens found in the prefix cache / looked up, over the last soak window",
        _field("prefix_hit_rate"),
    ),
    WindowGauge(
        "specsoak_soak_engine_anon_swap_bytes",
        "anonymous resident + swapped memory of the engine's process tree (RssAnon + VmSwap)",
        _field("engine_anon_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_engine_swap_bytes",
        "swapped-out memory of the engine's process tree (VmSwap)",
        _field("engine_swap_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_engine_net_memory_bytes",
        "the larger of RSS and anon + swap, less the prompt cache: what the watchdog watches",
        _field("engine_memory_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_prompt_cache_bytes",
        "the engine's host prompt cache as it last logged it (llama-server)",
        _field("prompt_cache_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_prompt_cache_cap_bytes",
        "the prompt cache's cap as the engine logs it (llama-server --cache-ram)",
        _field("prompt_cache_cap_mib", MIB),
    ),
    WindowGauge(
        "specsoak_soak_engine_requests_done",
        "requests the engine served since it started (its counter, else the harness's count)",
        _field("engine_requests_done"),
    ),
    WindowGauge(
        "specsoak_soak_engine_output_tokens_done",
        "output tokens the engine produced since it started",
        _field("engine_output_tokens_done"),
    ),
)
# series a verdict may name beside the change detector's (stall, prompt cache, GPU memory)
VERDICT_ONLY_METRICS = ("longest_stall_s", "prompt_cache_mib", "gpu_used_mib")
# the window series the soak's change detector watches (the ``detectors`` of a window record)
WATCHED_METRICS = tuple(WATCHED_CHANGES)  # the change detector's metrics, the ``metric`` label's values
BUFFERS = ("model_mib", "kv_mib", "compute_mib", "recurrent_mib")

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

ProcessReader = Callable[[int], "int | None"]


@dataclass
class _Config:
    labels: dict[str, str]
    pid: int | None = None
    active: bool = True
    solo_decode: list[float] = field(default_factory=list)
    total_tps: dict[int, list[float]] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    starts: int = 0


class _EngineCollector(Collector):
    """``specsoak_engine_up`` and ``specsoak_engine_resident_memory_bytes``, read at scrape time."""

    def __init__(self, exporter: MetricsExporter):
        self._exp = exporter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "specsoak_engine_up",
            "1 while the engine of the configuration being measured is running, 0 if its process is gone",
            labels=CONFIG_LABELS,
        )
        rss = GaugeMetricFamily(
            "specsoak_engine_resident_memory_bytes",
            "resident memory of the engine process (psutil, read at scrape time)",
            labels=CONFIG_LABELS,
        )
        for cfg in self._exp.active_configs():
            values = [cfg.labels[k] for k in CONFIG_LABELS]
            reader = self._exp.process_reader
            if reader is None or cfg.pid is None:
                up.add_metric(values, 1.0)
                continue
            value = reader(cfg.pid)
            up.add_metric(values, 0.0 if value is None else 1.0)
            if value is not None:
                rss.add_metric(values, float(value))
        yield up
        yield rss


class MetricsExporter(BaseObserver):
    """Run observer -> Prometheus metrics. ``start()`` serves them; ``close()`` stops serving."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        process_reader: ProcessReader | None = rss_bytes,
        clock: Callable[[], float] = time.time,
    ):
        self.host = host
        self.requested_port = port
        self.process_reader = process_reader
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._configs: dict[str, _Config] = {}
        self._run = ""
        self._engine = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        r = self.registry
        L = CONFIG_LABELS
        self.run_info = Info(
            "specsoak_run",
            "the run being measured (value 1)",
            ["run", "scenario", "engine", "engine_version", "specsoak_version"],
            registry=r,
        )
        self.run_start = Gauge("specsoak_run_start_time_seconds", "Unix time the run started", ["run"], registry=r)
        self.ttft = Histogram(
            "specsoak_request_ttft_seconds",
            "time to first token of successful requests",
            [*L, "phase"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "specsoak_request_inter_token_seconds",
            "gaps between consecutive text chunks (one observation per gap)",
            [*L, "phase"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specsoak_request_e2e_seconds",
            "request start to end of stream, successful requests",
            [*L, "phase"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.out_tokens = Counter(
            "specsoak_output_tokens", "output tokens of successful requests", [*L, "phase"], registry=r
        )
        self.requests = Counter(
            "specsoak_requests",
            "finished requests by status and error kind (error_kind empty when ok)",
            [*L, "phase", "status", "error_kind"],
            registry=r,
        )
        self.drafted = Counter(
            "specsoak_draft_tokens", "drafted tokens (engine counter deltas over measured phases)", L, registry=r
        )
        self.accepted = Counter(
            "specsoak_accepted_tokens",
            "accepted drafted tokens (engine counter deltas over measured phases)",
            L,
            registry=r,
        )
        self.steps = Counter(
            "specsoak_verify_steps", "verification steps (engine counter deltas over measured phases)", L, registry=r
        )
        self.per_pos = Counter(
            "specsoak_accepted_tokens_per_position",
            f"verification steps that accepted at least position+1 drafted tokens (first {MAX_POSITIONS} positions)",
            [*L, "position"],
            registry=r,
        )
        self.phase_acc = Gauge(
            "specsoak_phase_acceptance_ratio", "accepted / drafted tokens over the last measured phase", L, registry=r
        )
        self.phase_len = Gauge(
            "specsoak_phase_mean_acceptance_length",
            "1 + accepted / verification steps over the last measured phase (bonus token included)",
            L,
            registry=r,
        )
        self.phase_pos = Gauge(
            "specsoak_phase_position_acceptance_ratio",
            "per-position acceptance over the last measured phase",
            [*L, "position"],
            registry=r,
        )
        self.cum_acc = Gauge(
            "specsoak_cumulative_acceptance_ratio",
            "accepted / drafted tokens pooled over every measured phase of the configuration",
            L,
            registry=r,
        )
        self.cum_len = Gauge(
            "specsoak_cumulative_mean_acceptance_length",
            "1 + accepted / verification steps pooled over every measured phase",
            L,
            registry=r,
        )
        self.phase_tps = Gauge(
            "specsoak_phase_total_tokens_per_second",
            "output tokens / wall time of the last measured phase at this stream count",
            [*L, "streams"],
            registry=r,
        )
        self.total_tps = Gauge(
            "specsoak_total_tokens_per_second",
            "median over repetitions of the phase total t/s at this stream count (the verdict's total t/s @N)",
            [*L, "streams"],
            registry=r,
        )
        self.phase_decode = Gauge(
            "specsoak_phase_median_decode_tokens_per_second",
            "median per-request decode t/s of the last measured phase",
            [*L, "streams"],
            registry=r,
        )
        self.solo = Gauge(
            "specsoak_solo_decode_tokens_per_second",
            "median decode t/s of successful measured requests at 1 stream (the verdict's solo decode t/s)",
            L,
            registry=r,
        )
        self.other_cores = Gauge(
            "specsoak_phase_other_cpu_cores",
            "CPU cores used by other processes during the last measured phase (contamination)",
            [*L, "streams"],
            registry=r,
        )
        self.engine_cores = Gauge(
            "specsoak_phase_engine_cpu_cores",
            "CPU cores used by the engine process tree during the last measured phase",
            [*L, "streams"],
            registry=r,
        )
        self.phases = Counter("specsoak_phases", "measured phases finished", [*L, "streams"], registry=r)
        self.ctx_slot = Gauge(
            "specsoak_servable_context_tokens",
            "context one stream can use (ctx per slot, from the start-up log)",
            L,
            registry=r,
        )
        self.ctx_total = Gauge(
            "specsoak_engine_context_tokens", "the engine's total context (from the start-up log)", L, registry=r
        )
        self.slots = Gauge("specsoak_engine_slots", "parallel slots the engine serves (max streams)", L, registry=r)
        self.buffers = Gauge(
            "specsoak_engine_buffer_bytes",
            "model / KV / compute / recurrent buffers of the target and draft (start-up log)",
            [*L, "role", "buffer"],
            registry=r,
        )
        self.ready = Gauge("specsoak_engine_ready_seconds", "engine start to ready", L, registry=r)
        self.start_time = Gauge(
            "specsoak_engine_start_time_seconds",
            "Unix time the engine of the configuration last started",
            L,
            registry=r,
        )
        self.restarts = Counter(
            "specsoak_engine_restarts", "engine starts of a configuration after its first", L, registry=r
        )
        self.failures = Counter(
            "specsoak_config_failures",
            "configurations the engine failed, by exception kind and stage",
            [*L, "kind", "stage"],
            registry=r,
        )
        self.failure_time = Gauge(
            "specsoak_config_failure_time_seconds",
            "Unix time of the configuration's last failure",
            [*L, "kind"],
            registry=r,
        )
        self.verdicts = Counter(
            "specsoak_watchdog_verdicts",
            "soak watchdog verdicts by kind (and the watched metric they name)",
            [*L, "kind", "metric"],
            registry=r,
        )
        self.verdict_time = Gauge(
            "specsoak_watchdog_verdict_time_seconds",
            "Unix time of the last verdict of this kind (and metric)",
            [*L, "kind", "metric"],
            registry=r,
        )
        self.machine_memory = Gauge(
            "specsoak_machine_memory_bytes",
            "the machine's memory: total (run start) and available (last soak window)",
            ["run", "kind"],
            registry=r,
        )
        # the last closed soak window (harness/soak/slice.py); None in the record -> no series
        self.window_gauges = [(g, Gauge(g.name, g.help, L, registry=r)) for g in WINDOW_GAUGES]
        self.soak_gpu_memory = Gauge(
            "specsoak_soak_gpu_memory_bytes",
            "GPU memory at the end of the last soak window (NVML): used and total over all GPUs, "
            "and the engine's processes where the driver reports them; absent without a GPU",
            [*L, "kind"],
            registry=r,
        )
        self.soak_windows = Counter("specsoak_soak_windows", "soak windows closed", L, registry=r)
        # the coverage (docs/soak.md#coverage): the windows with traffic, judged or not and why not
        self.soak_traffic_windows = Counter(
            "specsoak_soak_traffic_windows",
            "soak windows with traffic (load offered), by whether the change detector judged them and why not",
            [*L, "judged", "why"],
            registry=r,
        )
        self.change_score = Gauge(
            "specsoak_soak_change_score",
            "the change detector's score of a watched window series (last window)",
            [*L, "metric"],
            registry=r,
        )
        self.collapsed = Gauge(
            "specsoak_soak_collapsed",
            "1 while the change detector is in an episode (collapse) for the metric, else 0",
            [*L, "metric"],
            registry=r,
        )
        self.reference = Gauge(
            "specsoak_soak_reference",
            "the change detector's reference of the metric, in the window field's own unit (engine_memory_mib in MiB)",
            [*L, "metric"],
            registry=r,
        )
        self.relative_change = Gauge(
            "specsoak_soak_relative_change",
            "the last window's change relative to the detector's reference",
            [*L, "metric"],
            registry=r,
        )
        # the output canary (harness/soak/canary.py): its last round, and whether a divergence was called in this soak
        self.canary_differing = Gauge(
            "specsoak_soak_canary_differing_answers",
            "output canary: answers of the last round that differ from "
            "the reference (first: the configuration's first answers; baseline: its baseline's), absent before there is one",
            [*L, "reference"],
            registry=r,
        )
        self.canary_diverged = Gauge(
            "specsoak_soak_canary_diverged",
            "output canary: 1 once a divergence verdict was given in this configuration's soak, else 0",
            L,
            registry=r,
        )
        self.canary_answers = Counter(
            "specsoak_soak_canary_answers",
            "output canary answers by status (error: refused or failed)",
            [*L, "status"],
            registry=r,
        )
        self._detector_gauges = (self.change_score, self.collapsed, self.reference, self.relative_change)
        self.registry.register(_EngineCollector(self))

    # ---- serving ---------------------------------------------------------------------
    def start(self) -> MetricsExporter:
        self._server, self._thread = start_http_server(self.requested_port, self.host, registry=self.registry)
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("exporter not started")
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> MetricsExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- state -----------------------------------------------------------------------
    def active_configs(self) -> list[_Config]:
        with self._lock:
            return [c for c in self._configs.values() if c.active]

    def _cfg(self, name: str) -> _Config:
        cfg = self._configs.get(name)
        if cfg is None:  # a record for a configuration we never heard start (replay of a partial folder)
            cfg = _Config(
                {
                    "run": self._run,
                    "config": name,
                    "engine": self._engine,
                    "algorithm": "unknown",
                    "synthetic": "false",
                },
                active=False,
            )
            self._configs[name] = cfg
        return cfg

    # ---- observer --------------------------------------------------------------------
    def on_run_start(self, manifest: Manifest) -> None:
        self._run = manifest.run_id
        self._engine = manifest.engine or ""
        self.run_info.labels(
            run=self._run,
            scenario=manifest.scenario or "",
            engine=self._engine,
            engine_version=manifest.engine_version or "",
            specsoak_version=manifest.specsoak_version or "",
        ).info({})
        self.run_start.labels(run=self._run).set(float(manifest.started_unix or self.clock()))
        total_mib = manifest.machine.get("mem_total_mib")
        if total_mib is not None:
            self.machine_memory.labels(run=self._run, kind="total").set(float(total_mib) * MIB)

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        with self._lock:
            cfg = self._configs.get(config)
            labels = {
                "run": self._run,
                "config": config,
                "engine": engine,
                "algorithm": algorithm,
                "synthetic": "true" if synthetic else "false",
            }
            if cfg is None:
                cfg = self._configs[config] = _Config(labels)
            cfg.labels, cfg.pid, cfg.active = labels, engine_pid, True
            cfg.starts += 1
        restarts = self.restarts.labels(**labels)
        if cfg.starts > 1:
            restarts.inc()
        self.start_time.labels(**labels).set(self.clock())
        # Counters and histograms exist from the start at 0, so the first phase shows as an increase
        # (rate() and histogram_quantile() need a sample before the first observation).
        for phase in ("warmup", "measure", "ramp", "soak"):
            self.out_tokens.labels(**labels, phase=phase)
            self.requests.labels(**labels, phase=phase, status="ok", error_kind="")
            for hist in (self.ttft, self.itl, self.e2e):
                hist.labels(**labels, phase=phase)
        for c in (self.drafted, self.accepted, self.steps):
            c.labels(**labels)

    def on_capacity(self, config: str, capacity: Capacity, ready_s: float | None) -> None:
        lab = self._cfg(config).labels
        for gauge, v in (
            (self.ctx_slot, capacity.ctx_per_slot),
            (self.ctx_total, capacity.ctx_total),
            (self.slots, capacity.slots),
            (self.ready, ready_s),
        ):
            if v is not None:
                gauge.labels(**lab).set(float(v))
        for role, mem in (("target", capacity.target), ("draft", capacity.draft)):
            for key in BUFFERS:
                if mem is not None and (mib := getattr(mem, key)) is not None:
                    self.buffers.labels(**lab, role=role, buffer=key.removesuffix("_mib")).set(float(mib) * MIB)

    def on_request(self, record: RequestRecord) -> None:
        cfg = self._cfg(record.config)
        lab = {**cfg.labels, "phase": record.phase or "measure"}
        ok = record.status == "ok"
        self.requests.labels(
            **lab, status="ok" if ok else "error", error_kind="" if ok else (record.error_kind or "unknown")
        ).inc()
        if not ok:
            return
        if record.ttft_s is not None:
            self.ttft.labels(**lab).observe(float(record.ttft_s))
        if record.e2e_s is not None:
            self.e2e.labels(**lab).observe(float(record.e2e_s))
        itl = self.itl.labels(**lab)
        for gap in record.itl_s or ():
            itl.observe(float(gap))
        if record.output_tokens:
            self.out_tokens.labels(**lab).inc(int(record.output_tokens))
        if lab["phase"] == "measure" and record.streams == 1 and record.decode_tps:
            cfg.solo_decode.append(float(record.decode_tps))
            self.solo.labels(**cfg.labels).set(statistics.median(cfg.solo_decode))

    def on_phase(self, record: Phase) -> None:
        if record.phase != "measure":
            return
        cfg = self._cfg(record.config)
        lab = cfg.labels
        slab = {**lab, "streams": str(record.streams)}
        tps = float(record.total_tps or 0.0)
        self.phases.labels(**slab).inc()
        self.phase_tps.labels(**slab).set(tps)
        cfg.total_tps.setdefault(int(record.streams or 0), []).append(tps)
        self.total_tps.labels(**slab).set(statistics.median(cfg.total_tps[int(record.streams or 0)]))
        if record.median_decode_tps is not None:
            self.phase_decode.labels(**slab).set(float(record.median_decode_tps))
        cpu = record.cpu or {}
        if cpu.get("other_cores") is not None:
            self.other_cores.labels(**slab).set(float(cpu["other_cores"]))
        if cpu.get("engine_cores") is not None:
            self.engine_cores.labels(**slab).set(float(cpu["engine_cores"]))
        drafted, accepted, steps = self._add_counters(lab, record.counters or {})
        if (acc := record.get("acceptance")) is not None:
            self.phase_acc.labels(**lab).set(float(acc))
        if (length := record.get("mean_accept_len")) is not None:
            self.phase_len.labels(**lab).set(float(length))
        for i, p in enumerate((record.get("per_position") or [])[:MAX_POSITIONS]):
            self.phase_pos.labels(**lab, position=str(i)).set(float(p))
        cfg.drafted += drafted
        cfg.accepted += accepted
        cfg.steps += steps
        if cfg.drafted:
            self.cum_acc.labels(**lab).set(cfg.accepted / cfg.drafted)
        if cfg.steps:
            self.cum_len.labels(**lab).set(1.0 + cfg.accepted / cfg.steps)

    def _add_counters(self, lab: dict[str, str], counters: dict[str, Any]) -> tuple[int, int, int]:
        """Engine counter deltas (a measured phase's or a soak window's) onto the counters; None or a
        negative delta (the engine restarted) adds nothing."""

        def delta(v: Any) -> int:
            return max(0, int(v or 0))

        drafted, accepted, steps = (delta(counters.get(k)) for k in ("draft_tokens", "accepted_tokens", "verify_steps"))
        self.drafted.labels(**lab).inc(drafted)
        self.accepted.labels(**lab).inc(accepted)
        self.steps.labels(**lab).inc(steps)
        for i, n in enumerate((counters.get("accepted_per_position") or [])[:MAX_POSITIONS]):
            self.per_pos.labels(**lab, position=str(i)).inc(delta(n))
        return drafted, accepted, steps

    def on_window(self, record: SoakWindow) -> None:
        """A closed soak window: its figures as gauges (absent when None), its counter deltas added."""
        cfg = self._cfg(record.config)
        lab = cfg.labels
        values = [lab[k] for k in CONFIG_LABELS]
        now = self.clock()
        for spec, gauge in self.window_gauges:
            _set_or_remove(gauge, values, spec.value(record, now))
        for kind, key in (("used", "gpu_used_mib"), ("total", "gpu_total_mib"), ("engine", "engine_gpu_mib")):
            _set_or_remove(self.soak_gpu_memory, [*values, kind], _times(record.get(key), MIB))
        self.soak_windows.labels(**lab).inc()
        if has_traffic(record.to_dict()) and (judged := record.get("judged")) is not None:
            why = "" if judged else str(record.get("not_judged_why") or "not said")
            self.soak_traffic_windows.labels(**lab, judged=str(bool(judged)).lower(), why=why).inc()
        detectors = record.get("detectors") or {}
        for metric in WATCHED_METRICS:
            det = detectors.get(metric) or {}
            episode = det.get("in_episode")
            for gauge, v in (
                (self.change_score, det.get("score")),
                (self.collapsed, None if episode is None else float(bool(episode))),
                (self.reference, det.get("reference")),
                (self.relative_change, det.get("relative_change")),
            ):
                _set_or_remove(gauge, [*values, metric], v)
        _set_or_remove(
            self.machine_memory, [self._run, "available"], _times(record.get("machine_memory_available_mib"), MIB)
        )
        self._add_counters(lab, record.get("counters") or {})

    def _clear_soak(self, cfg: _Config) -> None:
        values = [cfg.labels[k] for k in CONFIG_LABELS]
        for _spec, gauge in self.window_gauges:
            gauge.remove(*values)
        for gauge in self._detector_gauges:
            for metric in WATCHED_METRICS:
                gauge.remove(*values, metric)
        for kind in ("used", "total", "engine"):
            self.soak_gpu_memory.remove(*values, kind)
        self.canary_diverged.remove(*values)
        for ref in ("first", "baseline"):
            self.canary_differing.remove(*values, ref)

    def on_failure(self, record: Failure) -> None:
        lab = self._cfg(record.config).labels
        kind = record.kind or "unknown"
        self.failures.labels(**lab, kind=kind, stage=record.stage or "unknown").inc()
        self.failure_time.labels(**lab, kind=kind).set(float(record.unix_s or self.clock()))

    def on_config_end(self, config: str, status: str) -> None:
        with self._lock:
            cfg = self._configs.get(config)
            if cfg is not None:
                cfg.active = False
        if cfg is not None:
            self._clear_soak(cfg)

    def on_run_end(self, status: str, reason: str) -> None:
        with self._lock:
            configs = list(self._configs.values())
            for cfg in configs:
                cfg.active = False
        for cfg in configs:
            self._clear_soak(cfg)

    # ---- for the soak watchdog ---------------------------------------------------------
    def on_verdict(self, record: Verdict) -> None:
        self.record_verdict(record.config, record.kind or "", record.metric, record.t_unix)

    def on_canary(self, record: CanaryRound) -> None:
        """A finished canary round: how many answers differ from each reference, errors counted, diverged or not."""
        lab = self._cfg(record.config).labels
        values = [lab[k] for k in CONFIG_LABELS]
        for ref, differing in (("first", record.differing_first), ("baseline", record.differing_baseline)):
            _set_or_remove(self.canary_differing, [*values, ref], differing)
        self.canary_diverged.labels(*values).set(float(bool(record.diverged)))
        errors = int(record.errors or 0)
        self.canary_answers.labels(**lab, status="ok").inc(max(0, int(record.answers or 0) - errors))
        self.canary_answers.labels(**lab, status="error").inc(errors)

    def record_verdict(self, config: str, kind: str, metric: str | None = None, t_unix: float | None = None) -> None:
        """A watchdog verdict of ``kind`` about ``config`` (and ``metric``): counted and timestamped.
        A kind outside VERDICT_KINDS counts as "other", a metric outside WATCHED_METRICS as "other"."""
        kind_label = kind if kind in VERDICT_KINDS else "other"
        metric_label = "" if not metric else metric if metric in (*WATCHED_METRICS, *VERDICT_ONLY_METRICS) else "other"
        lab = {**self._cfg(config).labels, "kind": kind_label, "metric": metric_label}
        self.verdicts.labels(**lab).inc()
        self.verdict_time.labels(**lab).set(float(t_unix) if t_unix is not None else self.clock())


def _times(v: Any, factor: float) -> float | None:
    return None if v is None else float(v) * factor


def _set_or_remove(gauge: Gauge, labelvalues: list[str], v: Any) -> None:
    """``v`` as the series' value, or no series at all when ``v`` is None (never 0 for "unknown")."""
    if v is None:
        gauge.remove(*labelvalues)
    else:
        gauge.labels(*labelvalues).set(float(v))
