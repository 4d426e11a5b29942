"""Grafana dashboards built in code (grafana-foundation-sdk, pinned to the Grafana 11.6 release),
their provisioning files, the generated Prometheus files and a docker-compose.yml for Prometheus +
Grafana. ``specsoak dashboards [--out DIR]`` writes all of it (``write_all``).

Panels are declared as data (``PanelSpec``) so the integration test can evaluate every expression a
dashboard uses (``all_expressions``) against a real Prometheus. Dashboard variables: ``$run``,
``$config`` (multi, "All" = ``.*``); range windows use Grafana's ``$__rate_interval``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, prometheus, table, timeseries
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, DataTransformerConfig, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from harness.metrics import rules, ruletests, scrape

DATASOURCE_UID = "specsoak-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
S = 'run=~"$run", config=~"$config"'
W = "$__rate_interval"
BYC = "config, algorithm, synthetic"
EXPORTER_PORT = 9464  # the port docker-compose's Prometheus scrapes; `specsoak run --metrics-port 9464`


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = "{{config}}"


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # timeseries | table | bargauge
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    color: str


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...]
    annotations: tuple[Annotation, ...] = ()


def _ratio_or_zero(num_sel: str, den_sel: str, by: str) -> str:
    den = f"sum by ({by}) (specsoak_requests_total{{{den_sel}}})"
    return f"(sum by ({by}) (specsoak_requests_total{{{num_sel}}}) or {den} * 0) / {den}"


OVERVIEW = DashboardSpec(
    "specsoak-overview",
    "specsoak: verdict per configuration",
    "The verdict table's figures (docs/metrics.md), live or from a backfilled run.",
    (
        PanelSpec(
            "Verdict per configuration",
            "table",
            (
                Query(f"max by ({BYC}) (specsoak_solo_decode_tokens_per_second{{{S}}})", "solo decode t/s"),
                Query(f"max by ({BYC}) (specsoak_cumulative_acceptance_ratio{{{S}}})", "acceptance"),
                Query(f"max by ({BYC}) (specsoak_cumulative_mean_acceptance_length{{{S}}})", "mean length"),
                Query(f"max by ({BYC}) (specsoak_servable_context_tokens{{{S}}})", "ctx/slot"),
                Query(f"max by ({BYC}) (specsoak_engine_slots{{{S}}})", "slots"),
                Query(f"max by ({BYC}) (specsoak:engine_memory_bytes:sum{{{S}}})", "memory bytes"),
                Query(
                    _ratio_or_zero(f'{S}, phase="measure", status="error"', f'{S}, phase="measure"', BYC),
                    "failed request share",
                ),
            ),
            description="Instant values at the end of the time range; acceptance and mean length are pooled over every measured phase.",
            width=24,
        ),
        PanelSpec(
            "Total t/s by streams, and vs baseline",
            "table",
            (
                Query(f"max by ({BYC}, streams) (specsoak_total_tokens_per_second{{{S}}})", "total t/s"),
                Query(f"max by ({BYC}, streams) (specsoak:total_tokens_per_second:vs_baseline{{{S}}})", "vs baseline"),
            ),
            width=12,
        ),
        PanelSpec(
            "Configuration failures by kind",
            "table",
            (Query(f"sum by (config, kind, stage) (specsoak_config_failures_total{{{S}}})", "failures"),),
            width=12,
        ),
        PanelSpec(
            "Solo decode t/s",
            "bargauge",
            (Query(f"max by (config) (specsoak_solo_decode_tokens_per_second{{{S}}})"),),
            unit="short",
        ),
        PanelSpec(
            "Output t/s (measured requests)",
            "timeseries",
            (Query(f'specsoak:output_tokens:rate1m{{{S}, phase="measure"}}'),),
            unit="short",
        ),
    ),
)

SOAK_SEL = f'{S}, phase="soak"'


def _win(metric: str, legend: str = "{{config}} window") -> Query:
    """A soak-window gauge of the exporter (absent when the window had no value)."""
    return Query(f"max by (config) ({metric}{{{S}}})", legend)


def _ref(metric: str, scale: str = "") -> Query:
    """The soak change detector's reference for one watched metric (in the window field's unit)."""
    return Query(f'max by (config) (specsoak_soak_reference{{{S}, metric="{metric}"}}){scale}', "{{config}} reference")


def _quantile(q: str, hist: str, legend: str) -> Query:
    return Query(f"histogram_quantile({q}, sum by (config, le) (rate({hist}_bucket{{{SOAK_SEL}}}[{W}])))", legend)


SOAK = DashboardSpec(
    "specsoak-soak",
    "specsoak: soak",
    "The soak of every configuration over time: its requests (phase soak), the watchdog's windows, the change detector, "
    "verdicts by kind; engine starts, configuration failures, verdicts and collapses are annotations.",
    (
        PanelSpec(
            "Output t/s: soak windows and client rate",
            "timeseries",
            (
                _win("specsoak_soak_output_tokens_per_second"),
                Query(f"max by (config) (specsoak:output_tokens:rate1m{{{SOAK_SEL}}})", "{{config}} client 1m"),
                _ref("output_tps"),
            ),
        ),
        PanelSpec(
            "Decode t/s (median per request, per window)",
            "timeseries",
            (_win("specsoak_soak_decode_tokens_per_second"), _ref("decode_tps")),
        ),
        PanelSpec(
            "Speed and prefill index: tokens streamed / what the engine streams at that concurrency, first-token service"
            " predicted / taken (1 = its own speed, any load)",
            "timeseries",
            (
                _win("specsoak_soak_speed_index"),
                _ref("speed_index"),
                _win("specsoak_soak_prefill_index", "{{config}} prefill index"),
            ),
        ),
        PanelSpec(
            "TTFT p50 / p99 (soak requests), window p95",
            "timeseries",
            (
                _quantile("0.5", "specsoak_request_ttft_seconds", "{{config}} p50"),
                _quantile("0.99", "specsoak_request_ttft_seconds", "{{config}} p99"),
                _win("specsoak_soak_ttft_p95_seconds", "{{config}} window p95"),
                _ref("ttft_p95_s"),
            ),
            unit="s",
        ),
        PanelSpec(
            "Inter-token gap p50 / p99, end-to-end p99 (soak requests)",
            "timeseries",
            (
                _quantile("0.5", "specsoak_request_inter_token_seconds", "{{config}} ITL p50"),
                _quantile("0.99", "specsoak_request_inter_token_seconds", "{{config}} ITL p99"),
                _quantile("0.99", "specsoak_request_e2e_seconds", "{{config}} e2e p99"),
            ),
            unit="s",
        ),
        PanelSpec(
            "Requests by status",
            "timeseries",
            (
                Query(
                    f"sum by (config, status, error_kind) (rate(specsoak_requests_total{{{S}}}[{W}]))",
                    "{{config}} {{status}} {{error_kind}}",
                ),
                Query(f"specsoak:request_error_ratio:rate5m{{{S}}}", "{{config}} error ratio (5m)"),
            ),
            unit="reqps",
        ),
        PanelSpec(
            "Error ratio per window",
            "timeseries",
            (_win("specsoak_soak_error_ratio"), _ref("error_ratio")),
            unit="percentunit",
        ),
        PanelSpec(
            "Acceptance: window, 5 min, detector reference",
            "timeseries",
            (
                _win("specsoak_soak_acceptance_ratio"),
                Query(f"specsoak:acceptance_ratio:rate5m{{{S}}}", "{{config}} 5m"),
                _ref("acceptance"),
            ),
            unit="percentunit",
        ),
        PanelSpec("Load: users", "timeseries", (_win("specsoak_soak_users", "{{config}} users"),)),
        PanelSpec(
            "Requests/s: asked, offered, achieved, goodput (per window)",
            "timeseries",
            (
                _win("specsoak_soak_asked_requests_per_second", "{{config}} asked"),
                _win("specsoak_soak_offered_requests_per_second", "{{config}} offered"),
                _win("specsoak_soak_achieved_requests_per_second", "{{config}} achieved"),
                _win("specsoak_soak_goodput_requests_per_second", "{{config}} goodput (SLO met)"),
            ),
            unit="reqps",
            description="Asked: the rate the scenario's curve asks; offered: arrivals scheduled in the window (open-loop soak "
            "only); achieved: successful requests finished in it; goodput: those that met the scenario's SLO (absent without one).",
        ),
        PanelSpec(
            "Late sends per window, longest send delay (open loop)",
            "timeseries",
            (
                _win("specsoak_soak_late_requests", "{{config}} late"),
                Query(
                    f"max by (config) (specsoak_soak_max_send_delay_seconds{{{S}}}) * 1000", "{{config}} max delay ms"
                ),
            ),
            description="Requests that could not go out at their scheduled time: max_in_flight reached, or the client lagged. "
            "Never silently delayed: each is recorded with its delay.",
        ),
        PanelSpec(
            "Engine memory: window, RSS now, machine available",
            "timeseries",
            (
                _win("specsoak_soak_engine_memory_bytes", "{{config}} engine tree (window)"),
                Query(f"max by (config) (specsoak_engine_resident_memory_bytes{{{S}}})", "{{config}} engine RSS"),
                _ref("engine_memory_mib", " * 1048576"),
                Query('max by (run, kind) (specsoak_machine_memory_bytes{run=~"$run"})', "machine {{kind}}"),
            ),
            unit="bytes",
        ),
        PanelSpec(
            "Engine memory: anon + swap, swap, prompt cache and its cap, net of the cache",
            "timeseries",
            (
                _win("specsoak_soak_engine_anon_swap_bytes", "{{config}} anon + swap"),
                _win("specsoak_soak_engine_swap_bytes", "{{config}} swap"),
                _win("specsoak_soak_prompt_cache_bytes", "{{config}} prompt cache"),
                _win("specsoak_soak_prompt_cache_cap_bytes", "{{config}} prompt cache cap"),
                _win("specsoak_soak_engine_net_memory_bytes", "{{config}} net of the cache (watched)"),
            ),
            unit="bytes",
            description="A leak never read again is swapped out: RSS stays flat while anon + swap grows. A prompt cache "
            "growing toward a cap that fits is by design; the watchdog watches memory net of it.",
        ),
        PanelSpec(
            "Stalls: longest chunk gap, gap p99, slowest health probe (per window)",
            "timeseries",
            (
                _win("specsoak_soak_longest_chunk_gap_seconds", "{{config}} longest gap"),
                _win("specsoak_soak_chunk_gap_p99_seconds", "{{config}} gap p99"),
                _win("specsoak_soak_probe_max_seconds", "{{config}} slowest probe"),
            ),
            unit="s",
            description="A pause freezes every stream and the health probe at once; window medians barely move. "
            "A stall verdict at watchdog.stall_warn_s.",
        ),
        PanelSpec(
            "Engine's view: running, waiting, preemptions per window",
            "timeseries",
            (
                _win("specsoak_soak_engine_requests_running", "{{config}} running"),
                _win("specsoak_soak_engine_requests_waiting", "{{config}} waiting"),
                _win("specsoak_soak_engine_preemptions", "{{config}} preemptions"),
            ),
            description="From the engine's own /metrics at the end of each window (absent where the engine does not expose them).",
        ),
        PanelSpec(
            "Engine's view: KV usage, prefix-cache hit rate (per window)",
            "timeseries",
            (
                _win("specsoak_soak_engine_kv_usage_ratio", "{{config}} KV usage"),
                _win("specsoak_soak_prefix_cache_hit_ratio", "{{config}} prefix-cache hit rate"),
            ),
            unit="percentunit",
            description="Acceptance that decays with the cache's state, not with time, shows beside these.",
        ),
        PanelSpec(
            "Work done since the engine started: requests, output tokens",
            "timeseries",
            (
                _win("specsoak_soak_engine_requests_done", "{{config}} requests"),
                _win("specsoak_soak_engine_output_tokens_done", "{{config}} output tokens"),
            ),
            description="Some failures come after a count of requests, not a time: read the soak against either.",
        ),
        PanelSpec(
            "Memory headroom (until available memory runs out)",
            "timeseries",
            (Query(f"min by (config) (specsoak_soak_memory_headroom_seconds{{{S}}})", "{{config}} headroom"),),
            unit="s",
            description="Absent while the engine's memory is not growing.",
        ),
        PanelSpec(
            "GPU memory: used, total, engine processes; headroom",
            "timeseries",
            (Query(f"max by (config, kind) (specsoak_soak_gpu_memory_bytes{{{S}}})", "{{config}} GPU {{kind}}"),),
            unit="bytes",
            description="NVML (harness/probe/gpu.py), at the end of each soak window; absent on a machine without an NVIDIA GPU. "
            "Engine: the engine's processes where the driver reports per-process memory.",
        ),
        PanelSpec(
            "GPU memory headroom (until the GPUs' free memory runs out)",
            "timeseries",
            (Query(f"min by (config) (specsoak_soak_gpu_memory_headroom_seconds{{{S}}})", "{{config}} GPU headroom"),),
            unit="s",
            description="Absent without a GPU, and while GPU memory is not growing (+Inf).",
        ),
        PanelSpec(
            "Engine up",
            "timeseries",
            (
                Query(f"max by (config) (specsoak_engine_up{{{S}}})", "{{config}} process"),
                Query(f'max by (config) (up{{job="{scrape.ENGINES_JOB}", {S}}})', "{{config}} /metrics"),
            ),
        ),
        PanelSpec(
            "Engine uptime", "timeseries", (_win("specsoak_engine_uptime_seconds", "{{config}} uptime"),), unit="s"
        ),
        PanelSpec(
            "Change detector: score per metric",
            "timeseries",
            (Query(f"max by (config, metric) (specsoak_soak_change_score{{{S}}})", "{{config}} {{metric}}"),),
        ),
        PanelSpec(
            "Change detector: collapsed (1 = in an episode), windows judged",
            "timeseries",
            (
                Query(f"max by (config, metric) (specsoak_soak_collapsed{{{S}}})", "{{config}} {{metric}} collapsed"),
                _win("specsoak_soak_window_judged", "{{config}} judged"),
            ),
        ),
        PanelSpec(
            "Change detector: change vs reference",
            "timeseries",
            (Query(f"max by (config, metric) (specsoak_soak_relative_change{{{S}}})", "{{config}} {{metric}}"),),
            unit="percentunit",
        ),
        PanelSpec(
            "Engine restarts and watchdog verdicts by kind",
            "timeseries",
            (
                Query(f"sum by (config) (specsoak_engine_restarts_total{{{S}}})", "{{config}} restarts"),
                Query(f"sum by (config, kind) (specsoak_watchdog_verdicts_total{{{S}}})", "{{config}} {{kind}}"),
            ),
        ),
        PanelSpec(
            "Harness resident memory (with its Locust processes)",
            "timeseries",
            (_win("specsoak_harness_resident_memory_bytes", "{{config}} harness"),),
            unit="bytes",
        ),
        PanelSpec(
            "CPU cores per soak window: engine, harness, others",
            "timeseries",
            (
                _win("specsoak_soak_engine_cpu_cores", "{{config}} engine"),
                _win("specsoak_soak_harness_cpu_cores", "{{config}} harness"),
                _win("specsoak_soak_other_cpu_cores", "{{config}} others (contamination)"),
            ),
        ),
    ),
    (
        Annotation(
            "Engine starts", f"(time() - max by (config) (specsoak_engine_start_time_seconds{{{S}}})) < 30", "blue"
        ),
        Annotation(
            "Configuration failures",
            f"(time() - max by (config, kind) (specsoak_config_failure_time_seconds{{{S}}})) < 60",
            "red",
        ),
        Annotation(
            "Watchdog verdicts",
            f"(time() - max by (config, kind, metric) (specsoak_watchdog_verdict_time_seconds{{{S}}})) < 60",
            "orange",
        ),
        Annotation(
            "Collapse verdicts",
            f'(time() - max by (config, metric) (specsoak_watchdog_verdict_time_seconds{{{S}, kind="collapse"}})) < 60',
            "purple",
        ),
    ),
)

# the engine-side panels read the engine-neutral series of rules.ENGINE_SERIES, whatever the engine
ENGINE_NOTE = "From the engine's own /metrics, mapped to one set of names (docs/observability.md); empty for an engine that does not report it."

SPECULATIVE = DashboardSpec(
    "specsoak-speculative",
    "specsoak: speculative decoding",
    "Acceptance, mean acceptance length (bonus token included), per-position acceptance, drafted vs accepted; "
    "the 5 min figures come from the engine counter deltas of measured phases and soak windows.",
    (
        PanelSpec(
            "Acceptance rate",
            "timeseries",
            (
                Query(f"max by (config) (specsoak_phase_acceptance_ratio{{{S}}})", "{{config}} last phase"),
                Query(f"specsoak:acceptance_ratio:rate5m{{{S}}}", "{{config}} 5m"),
                Query(f"max by (config) (specsoak_soak_acceptance_ratio{{{S}}})", "{{config}} soak window"),
                Query(f"max by (config) (specsoak_cumulative_acceptance_ratio{{{S}}})", "{{config}} cumulative"),
                Query(f"max by (config) ({rules.ENGINE_ACCEPTANCE}{{{S}}})", "{{config}} engine 1m"),
            ),
            unit="percentunit",
        ),
        PanelSpec(
            "Mean acceptance length",
            "timeseries",
            (
                Query(f"max by (config) (specsoak_phase_mean_acceptance_length{{{S}}})", "{{config}} last phase"),
                Query(f"specsoak:mean_acceptance_length:rate5m{{{S}}}", "{{config}} 5m"),
                Query(f"max by (config) (specsoak_soak_mean_acceptance_length{{{S}}})", "{{config}} soak window"),
                Query(f"max by (config) (specsoak_cumulative_mean_acceptance_length{{{S}}})", "{{config}} cumulative"),
            ),
        ),
        PanelSpec(
            "Per-position acceptance (last phase)",
            "bargauge",
            (
                Query(
                    f"max by (config, position) (specsoak_phase_position_acceptance_ratio{{{S}}})",
                    "{{config}} pos {{position}}",
                ),
            ),
            unit="percentunit",
        ),
        PanelSpec(
            "Per-position acceptance (5 min)",
            "timeseries",
            (Query(f"specsoak:position_acceptance_ratio:rate5m{{{S}}}", "{{config}} pos {{position}}"),),
            unit="percentunit",
        ),
        PanelSpec(
            "Drafted vs accepted tokens/s (harness: measured phases and soak windows)",
            "timeseries",
            (
                Query(f"sum by (config) (rate(specsoak_draft_tokens_total{{{S}}}[{W}]))", "{{config}} drafted"),
                Query(f"sum by (config) (rate(specsoak_accepted_tokens_total{{{S}}}[{W}]))", "{{config}} accepted"),
            ),
        ),
        PanelSpec(
            "Drafted vs accepted tokens/s (engine /metrics, 1 min)",
            "timeseries",
            (
                Query(f"sum by (config) ({rules.ENGINE_DRAFT_TOKENS}{{{S}}})", "{{config}} drafted"),
                Query(f"sum by (config) ({rules.ENGINE_ACCEPTED_TOKENS}{{{S}}})", "{{config}} accepted"),
                Query(f"sum by (config) ({rules.ENGINE_VERIFY_STEPS}{{{S}}})", "{{config}} verify steps"),
            ),
            description=ENGINE_NOTE,
        ),
    ),
)

CAPACITY = DashboardSpec(
    "specsoak-capacity",
    "specsoak: capacity and memory",
    "What the engine really serves (from its start-up log) and what it costs in memory.",
    (
        PanelSpec(
            "Context and slots",
            "table",
            (
                Query(f"max by ({BYC}) (specsoak_servable_context_tokens{{{S}}})", "ctx/slot"),
                Query(f"max by ({BYC}) (specsoak_engine_context_tokens{{{S}}})", "ctx total"),
                Query(f"max by ({BYC}) (specsoak_engine_slots{{{S}}})", "slots"),
                Query(f"max by ({BYC}) (specsoak_engine_ready_seconds{{{S}}})", "ready s"),
            ),
            width=24,
        ),
        PanelSpec(
            "Buffers by role (start-up log)",
            "bargauge",
            (
                Query(
                    f"sum by (config, role, buffer) (specsoak_engine_buffer_bytes{{{S}}})",
                    "{{config}} {{role}} {{buffer}}",
                ),
            ),
            unit="bytes",
        ),
        PanelSpec(
            "Engine memory: buffers and RSS",
            "timeseries",
            (
                Query(f"specsoak:engine_memory_bytes:sum{{{S}}}", "{{config}} buffers"),
                Query(f"max by (config) (specsoak_engine_resident_memory_bytes{{{S}}})", "{{config}} RSS"),
            ),
            unit="bytes",
        ),
        PanelSpec(
            "Engine CPU cores per phase",
            "timeseries",
            (Query(f"max by (config, streams) (specsoak_phase_engine_cpu_cores{{{S}}})", "{{config}} @{{streams}}"),),
        ),
        PanelSpec(
            "Engine queue (engine /metrics)",
            "timeseries",
            (
                Query(f"sum by (config) ({rules.ENGINE_RUNNING}{{{S}}})", "{{config}} running"),
                Query(f"sum by (config) ({rules.ENGINE_WAITING}{{{S}}})", "{{config}} waiting"),
            ),
            description=ENGINE_NOTE,
        ),
        PanelSpec(
            "Engine KV cache usage (engine /metrics)",
            "timeseries",
            (Query(f"max by (config) ({rules.ENGINE_KV_USAGE}{{{S}}})", "{{config}} KV used"),),
            unit="percentunit",
            description=ENGINE_NOTE,
        ),
    ),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (OVERVIEW, SOAK, SPECULATIVE, CAPACITY)
VARIABLE_QUERIES = {
    "run": "label_values(specsoak_run_info, run)",
    "config": 'label_values(specsoak_requests_total{run=~"$run"}, config)',
}


def _panel(spec: PanelSpec, pid: int) -> Any:
    builder: Any
    if spec.kind == "timeseries":
        builder = timeseries.Panel()
    elif spec.kind == "table":
        builder = table.Panel().with_transformation(DataTransformerConfig(id_val="merge", options={}))
    elif spec.kind == "bargauge":
        builder = bargauge.Panel()
    else:
        raise ValueError(f"unknown panel kind {spec.kind}")
    builder = builder.id(pid).title(spec.title).datasource(DATASOURCE).unit(spec.unit).span(spec.width).height(8)
    if spec.description:
        builder = builder.description(spec.description)
    instant = spec.kind != "timeseries"
    for i, q in enumerate(spec.queries):
        target = (
            prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        )
        target = (
            target.instant().format(PromQueryFormat.TABLE)
            if spec.kind == "table"
            else (target.instant() if instant else target.range())
        )
        builder = builder.with_target(target)
    return builder


def build_dashboard(spec: DashboardSpec) -> dict[str, Any]:
    b = (
        gd.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["specsoak"])
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("utc")
        .with_variable(
            gd.QueryVariable("run")
            .label("run")
            .datasource(DATASOURCE)
            .query(VARIABLE_QUERIES["run"])
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            gd.QueryVariable("config")
            .label("configuration")
            .datasource(DATASOURCE)
            .query(VARIABLE_QUERIES["config"])
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    for a in spec.annotations:
        b = b.annotation(
            gd.AnnotationQuery().name(a.name).datasource(DATASOURCE).enable(True).icon_color(a.color).expr(a.expr)
        )
    for n, p in enumerate(spec.panels, start=1):
        b = b.with_panel(_panel(p, n))
    data: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    data.setdefault("annotations", {}).setdefault("list", [])
    return data


def variable_selector(query: str) -> str:
    """The series selector inside a ``label_values(SELECTOR, label)`` variable query."""
    inner = query.removeprefix("label_values(").removesuffix(")")
    return inner.rsplit(",", 1)[0].strip()


# series that exist only while a soak runs (the soak's windows, verdicts and engine age)
SOAK_ONLY_MARKERS = (
    "specsoak_soak_",
    'phase="soak"',
    "specsoak_engine_uptime_seconds",
    "specsoak_harness_resident_memory_bytes",
    "specsoak_watchdog_verdict",
    "predict_linear(",
)


GPU_ONLY_MARKERS = ("specsoak_soak_gpu_",)
# series only an open-loop soak (soak.arrival) has: the live soak test runs closed loop, a backfill of open-loop windows checks these
OPEN_LOOP_ONLY_MARKERS = (
    "specsoak_soak_asked_",
    "specsoak_soak_offered_",
    "specsoak_soak_late_",
    "specsoak_soak_max_send_delay_",
)


# series a llama-server soak does not have (vLLM's KV usage and preemptions): a backfill of vLLM-shaped windows checks these
PAGED_KV_ONLY_MARKERS = ("specsoak_soak_engine_kv_usage_", "specsoak_soak_engine_preemptions")


def paged_kv_only(expr: str) -> bool:
    """Whether an expression reads a window series only paged-KV engines (vLLM) report."""
    return any(m in expr for m in PAGED_KV_ONLY_MARKERS)


def open_loop_only(expr: str) -> bool:
    """Whether an expression can only have data during an open-loop soak."""
    return any(m in expr for m in OPEN_LOOP_ONLY_MARKERS)


def gpu_only(expr: str) -> bool:
    """Whether an expression can only have data on a machine with an NVIDIA GPU (NVML): the live tests on a CPU
    check these through a backfill of GPU windows instead (tests/unit/test_dashboards.py)."""
    return any(m in expr for m in GPU_ONLY_MARKERS)


def soak_only(uid: str, expr: str) -> bool:
    """Whether an expression can only have data during a soak: the soak dashboard, or a soak-only series.
    The live tests split on it: a measured run checks the others, a real soak these."""
    return uid == "specsoak-soak" or any(m in expr for m in SOAK_ONLY_MARKERS)


def reported_by(engine: str, uid: str, expr: str) -> bool:
    """Whether an expression can have data where only ``engine`` is scraped: not another engine's rule
    (uid ``rules:<engine>``), and no engine-neutral series the engine does not report."""
    if uid.startswith("rules:"):
        return uid == f"rules:{engine}"
    return rules.engine_outputs_in(expr) <= set(rules.ENGINE_SERIES[engine])


def engine_side(uid: str, expr: str) -> bool:
    """An expression over the engines' own scrape: an engine-neutral series, the engine job, or an engine's rule."""
    return uid.startswith("rules:") or bool(rules.engine_outputs_in(expr)) or f'job="{scrape.ENGINES_JOB}"' in expr


def all_expressions() -> list[tuple[str, str, str]]:
    """(dashboard uid, where, PromQL) for every panel target and annotation, then every rule (an engine's
    rules under uid ``rules:<engine>``)."""
    out: list[tuple[str, str, str]] = []
    for d in DASHBOARDS:
        out.extend((d.uid, f"panel '{p.title}' ({q.legend})", q.expr) for p in d.panels for q in p.queries)
        out.extend((d.uid, f"annotation '{a.name}'", a.expr) for a in d.annotations)
    for name, query in VARIABLE_QUERIES.items():
        out.append(("variables", f"variable ${name}", variable_selector(query)))
    out.extend(("rules", f"record {r.record}", r.expr) for r in rules.RECORDS)
    out.extend((f"rules:{er.engine}", f"record {er.record}", er.expr) for er in rules.ENGINE_RECORDS)
    out.extend(("rules", f"alert {al.name} (its watched value)", al.value) for al in rules.ALERTS)
    return out


# ---- the files ------------------------------------------------------------------------
COMPOSE = f"""\
# Prometheus + Grafana for a specsoak run on this host (Linux: host networking, so Prometheus reaches
# the exporter and every engine on 127.0.0.1). Start a run with `specsoak run SCENARIO --metrics-port {EXPORTER_PORT}`,
# then `docker compose -f dashboards/docker-compose.yml up` and open http://127.0.0.1:3000 (admin/admin).
# Generated by `specsoak dashboards`; edit harness/metrics/dashboards.py instead.
services:
  prometheus:
    image: prom/prometheus:v2.53.0
    network_mode: host
    command:
      - --config.file=/etc/prometheus/prometheus.yml
      - --storage.tsdb.path=/prometheus
      - --storage.tsdb.retention.time=100y
      - --web.listen-address=127.0.0.1:9090
    volumes:
      - ./prometheus:/etc/prometheus:ro
      - ../results:/specsoak/results:ro
      - prometheus-data:/prometheus
  grafana:
    image: grafana/grafana:11.6.0
    network_mode: host
    environment:
      GF_SERVER_HTTP_ADDR: 127.0.0.1
      GF_SERVER_HTTP_PORT: "3000"
      GF_AUTH_ANONYMOUS_ENABLED: "true"
      GF_AUTH_ANONYMOUS_ORG_ROLE: Viewer
    volumes:
      - ./grafana/provisioning:/etc/grafana/provisioning:ro
      - ./grafana/dashboards:/var/lib/grafana/dashboards/specsoak:ro
    depends_on:
      - prometheus
volumes:
  prometheus-data: {{}}
"""


def provisioning_datasource(url: str = "http://127.0.0.1:9090") -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "specsoak Prometheus",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": url,
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": "5s"},
            }
        ],
    }


def provisioning_dashboards() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "specsoak",
                "folder": "specsoak",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "options": {"path": "/var/lib/grafana/dashboards/specsoak"},
            }
        ],
    }


def generated_files() -> dict[str, str]:
    """Relative path -> content of every generated file under dashboards/ (the schema is kept by hand)."""
    files: dict[str, str] = {}
    for spec in DASHBOARDS:
        files[f"grafana/dashboards/{spec.uid}.json"] = (
            json.dumps(build_dashboard(spec), indent=2, sort_keys=True) + "\n"
        )
    files["grafana/provisioning/datasources/specsoak.yml"] = rules.dump_yaml(provisioning_datasource())
    files["grafana/provisioning/dashboards/specsoak.yml"] = rules.dump_yaml(provisioning_dashboards())
    header = "# Generated by `specsoak dashboards` (harness/metrics/rules.py, scrape.py, ruletests.py); do not edit.\n"
    files["prometheus/prometheus.yml"] = header + rules.dump_yaml(
        scrape.prometheus_config(
            [f"127.0.0.1:{EXPORTER_PORT}"], ["/specsoak/results/prometheus-targets/*.json"], ["rules.yml"]
        )
    )
    files["prometheus/rules.yml"] = header + rules.dump_yaml(rules.rules_document())
    files["prometheus/rules.test.yml"] = header + rules.dump_yaml(ruletests.rule_tests_document("rules.yml"))
    files["docker-compose.yml"] = COMPOSE
    return files


def write_all(out: Path) -> list[Path]:
    written = []
    for rel, text in generated_files().items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
