"""Prometheus recording and alerting rules (dashboards/prometheus/rules.yml, ``specsoak dashboards``).

Recording rules compute the verdict figures from the exporter's counters over a window, and map
each engine's own series to one engine-neutral set (``specsoak:engine_*``: each adapter's
``promql_series``, engines/promql.py); alerting rules are the soak verdicts. Every alert is written
as ``VALUE OP THRESHOLD``: ``Alert.value`` is the ratio or series it watches, which has data while
what it watches runs (a measured phase, or a soak window; the soak alerts that compare with the
change detector's reference once the detector has one), so the integration test evaluates it (an
alert's own expression is normally empty, and must be).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from engines import ENGINES
from engines.promql import (
    BY,
    ENGINE_ACCEPTANCE,
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_DRAFT_TOKENS,
    ENGINE_KV_USAGE,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
    rate,
)
from harness.metrics.scrape import ENGINES_JOB


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    help: str
    engine: str | None = (
        None  # an engine's own series mapped to an engine-neutral one (its group: specsoak-engine-<engine>)
    )


@dataclass(frozen=True)
class Alert:
    name: str
    value: str  # what is watched; never empty while a run is scraped
    op: str
    threshold: float
    for_: str
    severity: str
    summary: str

    @property
    def expr(self) -> str:
        return f"{self.value} {self.op} {self.threshold:g}"


def _quantile(q: str, bucket: str) -> str:
    return f'histogram_quantile({q}, sum by ({BY}, phase, le) (rate({bucket}{{phase=~"measure|soak"}}[5m])))'


_REQUESTS = rate("specsoak_requests_total", "5m")
_ERRORS = rate("specsoak_requests_total", "5m", 'status="error"')

RECORDS: tuple[Record, ...] = (
    Record(
        "specsoak:output_tokens:rate1m",
        f"sum by ({BY}, phase) (rate(specsoak_output_tokens_total[1m]))",
        "output t/s of successful requests per phase (measure, soak, ...), all streams together",
    ),
    Record(
        "specsoak:request_error_ratio:rate5m",
        f"({_ERRORS} or {_REQUESTS} * 0) / {_REQUESTS}",
        "failed / all requests over 5 minutes (0 when none failed)",
    ),
    Record(
        "specsoak:acceptance_ratio:rate5m",
        f"{rate('specsoak_accepted_tokens_total', '5m')} / {rate('specsoak_draft_tokens_total', '5m')}",
        "accepted / drafted over 5 minutes",
    ),
    Record(
        "specsoak:mean_acceptance_length:rate5m",
        f"1 + {rate('specsoak_accepted_tokens_total', '5m')} / {rate('specsoak_verify_steps_total', '5m')}",
        "tokens per verification step over 5 minutes, bonus token included",
    ),
    Record(
        "specsoak:position_acceptance_ratio:rate5m",
        f"sum by ({BY}, position) (rate(specsoak_accepted_tokens_per_position_total[5m])) "
        f"/ on ({BY}) group_left {rate('specsoak_verify_steps_total', '5m')}",
        "share of verification steps accepting at least position+1 drafted tokens",
    ),
    Record(
        "specsoak:request_ttft_seconds:p50_5m",
        _quantile("0.5", "specsoak_request_ttft_seconds_bucket"),
        "median TTFT of measured and soak requests (phase)",
    ),
    Record(
        "specsoak:request_ttft_seconds:p99_5m",
        _quantile("0.99", "specsoak_request_ttft_seconds_bucket"),
        "p99 TTFT of measured and soak requests (phase)",
    ),
    Record(
        "specsoak:request_inter_token_seconds:p99_5m",
        _quantile("0.99", "specsoak_request_inter_token_seconds_bucket"),
        "p99 inter-token gap of measured and soak requests (phase)",
    ),
    Record(
        "specsoak:total_tokens_per_second:vs_baseline",
        "max without (job, instance) (specsoak_total_tokens_per_second) "
        '/ on (run, streams) group_left max by (run, streams) (specsoak_total_tokens_per_second{algorithm="none"})',
        "total t/s @N relative to the run's configuration with algorithm none",
    ),
    Record(
        "specsoak:engine_memory_bytes:sum",
        f"sum by ({BY}) (specsoak_engine_buffer_bytes)",
        "model + KV + compute (+ recurrent) buffers of target and draft",
    ),
)


def _max(metric: str, sel: str = "") -> str:
    return f"max by ({BY}) ({metric}{{{sel}}})" if sel else f"max by ({BY}) ({metric})"


_CUM = _max("specsoak_cumulative_acceptance_ratio")
_SOAK_ACC_REF = _max("specsoak_soak_reference", 'metric="acceptance"')
# during a soak: the last window's acceptance against the change detector's reference (the soak's
# prompts, after warm-up); otherwise 5 minutes of measured phases against the run's pooled figure
_ACCEPTANCE_DRIFT = (
    f"((abs({_max('specsoak_soak_acceptance_ratio')} - {_SOAK_ACC_REF}) / {_SOAK_ACC_REF})"
    f" or (abs(specsoak:acceptance_ratio:rate5m - {_CUM}) / {_CUM} unless on ({BY}) specsoak_soak_window_end_time_seconds))"
)
_SOAK_TPS_REF = _max("specsoak_soak_reference", 'metric="output_tps"')
_RSS = "specsoak_engine_resident_memory_bytes"
_RSS_GROWTH_1H = f"max by ({BY}) (predict_linear({_RSS}[30m], 3600) - {_RSS})"
_AVAILABLE = 'max by (run) (specsoak_machine_memory_bytes{kind="available"})'
ALERTS: tuple[Alert, ...] = (
    Alert(
        "SpecsoakEngineDown",
        f"min by ({BY}) (specsoak_engine_up)",
        "<",
        1,
        "30s",
        "critical",
        "{{ $labels.config }}: the engine process is gone while it is being measured",
    ),
    Alert(
        "SpecsoakEngineScrapeDown",
        f'min by ({BY}) (up{{job="{ENGINES_JOB}"}})',
        "<",
        1,
        "1m",
        "warning",
        "{{ $labels.config }}: the engine's /metrics cannot be scraped",
    ),
    Alert(
        "SpecsoakErrorRate",
        "specsoak:request_error_ratio:rate5m",
        ">",
        0.05,
        "2m",
        "critical",
        "{{ $labels.config }}: more than 5% of requests failed over 5 minutes",
    ),
    Alert(
        "SpecsoakAcceptanceDrift",
        _ACCEPTANCE_DRIFT,
        ">",
        0.2,
        "10m",
        "warning",
        "{{ $labels.config }}: acceptance is more than 20% away from its reference "
        "(soak: the change detector's; otherwise the run's measured phases)",
    ),
    Alert(
        "SpecsoakThroughputDrop",
        f"{_max('specsoak_soak_output_tokens_per_second')} / {_SOAK_TPS_REF}",
        "<",
        0.8,
        "10m",
        "warning",
        "{{ $labels.config }}: soak output t/s is more than 20% below the change detector's reference",
    ),
    Alert(
        "SpecsoakRssCreep",
        f"max by ({BY}) (specsoak_engine_resident_memory_bytes) / max by ({BY}) (min_over_time(specsoak_engine_resident_memory_bytes[1h]))",
        ">",
        1.2,
        "15m",
        "warning",
        "{{ $labels.config }}: engine RSS grew more than 20% over its lowest of the last hour",
    ),
    Alert(
        "SpecsoakCollapse",
        f"max by ({BY}, metric) (specsoak_soak_collapsed)",
        "==",
        1,
        "0s",
        "critical",
        "{{ $labels.config }}: {{ $labels.metric }} collapsed (the soak's change detector is in an episode)",
    ),
    Alert(
        "SpecsoakCanaryDivergence",
        f"max by ({BY}) (specsoak_soak_canary_diverged)",
        "==",
        1,
        "0s",
        "critical",
        "{{ $labels.config }}: the output canary's greedy answers diverged from their reference (a divergence verdict)",
    ),
    Alert(
        "SpecsoakMemoryExhaustion",
        f"min by ({BY}) (specsoak_soak_memory_headroom_seconds)",
        "<",
        3600,
        "2m",
        "critical",
        "{{ $labels.config }}: at the engine's memory growth the machine's available memory runs out in {{ $value | humanizeDuration }}",
    ),
    Alert(
        "SpecsoakStall",
        f"max by ({BY}) (max_over_time(specsoak_soak_longest_chunk_gap_seconds[5m]))",
        ">",
        5,
        "0s",
        "warning",
        "{{ $labels.config }}: a stream waited {{ $value | humanizeDuration }} for the engine between two chunks (a pause of the whole engine)",
    ),
    Alert(
        "SpecsoakMemoryExhaustionForecast",
        f"{_RSS_GROWTH_1H} / on (run) group_left {_AVAILABLE}",
        ">",
        1,
        "15m",
        "warning",
        "{{ $labels.config }}: engine RSS, extrapolated from its last 30 minutes, grows past the machine's available memory within an hour",
    ),
)


# ---- each engine's own /metrics under one engine-neutral set of names -------------------------
# The engines' series carry the run's labels (the file_sd target, harness/metrics/targets.py); the
# rules below give every engine the same `specsoak:engine_*` series, so one dashboard serves all.
# Each adapter says how (engines/*.py promql_series, the same arithmetic as its normalise_metrics);
# an output an engine does not report has no rule for it (docs/observability.md's table).
@dataclass(frozen=True)
class EngineOutput:
    record: str
    help: str


ENGINE_OUTPUTS: tuple[EngineOutput, ...] = (
    EngineOutput(ENGINE_DRAFT_TOKENS, "drafted tokens per second"),
    EngineOutput(ENGINE_ACCEPTED_TOKENS, "accepted drafted tokens per second (no bonus token)"),
    EngineOutput(ENGINE_VERIFY_STEPS, "verification steps per second"),
    EngineOutput(ENGINE_ACCEPTANCE, "accepted / drafted"),
    EngineOutput(ENGINE_RUNNING, "requests being generated now (summed over data-parallel ranks)"),
    EngineOutput(ENGINE_WAITING, "requests queued now"),
    EngineOutput(ENGINE_KV_USAGE, "used share of the KV cache, 0..1 (the fullest pool)"),
)


# engine -> output -> PromQL over the engine's own series
ENGINE_SERIES: dict[str, dict[str, str]] = {
    name: dict(cls.promql_series) for name, cls in ENGINES.items() if cls.promql_series
}

ENGINE_RECORDS: tuple[Record, ...] = tuple(
    Record(o.record, series[o.record], o.help, engine)
    for engine, series in ENGINE_SERIES.items()
    for o in ENGINE_OUTPUTS
    if o.record in series
)


def engine_outputs_in(expr: str) -> frozenset[str]:
    """The engine-neutral series an expression reads."""
    return frozenset(o.record for o in ENGINE_OUTPUTS if o.record in expr)


def rule_count() -> int:
    return len(RECORDS) + len(ENGINE_RECORDS) + len(ALERTS)


def rules_document() -> dict[str, Any]:
    return {
        "groups": [
            {"name": "specsoak-verdict", "rules": [{"record": r.record, "expr": r.expr} for r in RECORDS]},
            *(
                # the label the target already has: it tells promtool the same name from another group is no duplicate
                {
                    "name": f"specsoak-engine-{engine}",
                    "rules": [
                        {"record": r.record, "expr": r.expr, "labels": {"engine": engine}}
                        for r in ENGINE_RECORDS
                        if r.engine == engine
                    ],
                }
                for engine in ENGINE_SERIES
            ),
            {
                "name": "specsoak-soak",
                "rules": [
                    {
                        "alert": a.name,
                        "expr": a.expr,
                        "for": a.for_,
                        "labels": {"severity": a.severity},
                        "annotations": {"summary": a.summary},
                    }
                    for a in ALERTS
                ],
            },
        ]
    }


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=200)
