"""Generated Prometheus configuration: scrape jobs, recording rules, alerting rules, rule unit tests.

Recording rules compute the verdict figures from the exporter's counters over a window; alerting
rules are the soak verdicts. Every alert is written as ``VALUE OP THRESHOLD``: ``Alert.value`` is
the ratio or series it watches, which has data while what it watches runs (a measured phase, or a
soak window; the soak alerts that compare with the change detector's reference once the detector
has one), so the integration test evaluates it (an alert's own expression is normally empty, and
must be).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

EXPORTER_JOB = "specsoak"
ENGINES_JOB = "specsoak-engines"
BY = "run, config, engine, algorithm, synthetic"
BY_LABELS = ("run", "config", "engine", "algorithm", "synthetic")


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    help: str


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


def _rate(metric: str, window: str, sel: str = "") -> str:
    return f"sum by ({BY}) (rate({metric}{{{sel}}}[{window}]))" if sel else f"sum by ({BY}) (rate({metric}[{window}]))"


def _quantile(q: str, bucket: str) -> str:
    return f'histogram_quantile({q}, sum by ({BY}, phase, le) (rate({bucket}{{phase=~"measure|soak"}}[5m])))'


_REQUESTS = _rate("specsoak_requests_total", "5m")
_ERRORS = _rate("specsoak_requests_total", "5m", 'status="error"')

RECORDS: tuple[Record, ...] = (
    Record("specsoak:output_tokens:rate1m", f"sum by ({BY}, phase) (rate(specsoak_output_tokens_total[1m]))", "output t/s of successful requests per phase (measure, soak, ...), all streams together"),
    Record(
        "specsoak:request_error_ratio:rate5m",
        f"({_ERRORS} or {_REQUESTS} * 0) / {_REQUESTS}",
        "failed / all requests over 5 minutes (0 when none failed)",
    ),
    Record("specsoak:acceptance_ratio:rate5m", f"{_rate('specsoak_accepted_tokens_total', '5m')} / {_rate('specsoak_draft_tokens_total', '5m')}", "accepted / drafted over 5 minutes"),
    Record("specsoak:mean_acceptance_length:rate5m", f"1 + {_rate('specsoak_accepted_tokens_total', '5m')} / {_rate('specsoak_verify_steps_total', '5m')}", "tokens per verification step over 5 minutes, bonus token included"),
    Record(
        "specsoak:position_acceptance_ratio:rate5m",
        f"sum by ({BY}, position) (rate(specsoak_accepted_tokens_per_position_total[5m])) / on ({BY}) group_left {_rate('specsoak_verify_steps_total', '5m')}",
        "share of verification steps accepting at least position+1 drafted tokens",
    ),
    Record("specsoak:request_ttft_seconds:p50_5m", _quantile("0.5", "specsoak_request_ttft_seconds_bucket"), "median TTFT of measured and soak requests (phase)"),
    Record("specsoak:request_ttft_seconds:p99_5m", _quantile("0.99", "specsoak_request_ttft_seconds_bucket"), "p99 TTFT of measured and soak requests (phase)"),
    Record("specsoak:request_inter_token_seconds:p99_5m", _quantile("0.99", "specsoak_request_inter_token_seconds_bucket"), "p99 inter-token gap of measured and soak requests (phase)"),
    Record(
        "specsoak:total_tokens_per_second:vs_baseline",
        "max without (job, instance) (specsoak_total_tokens_per_second) / on (run, streams) group_left max by (run, streams) (specsoak_total_tokens_per_second{algorithm=\"none\"})",
        "total t/s @N relative to the run's configuration with algorithm none",
    ),
    Record("specsoak:engine_memory_bytes:sum", f"sum by ({BY}) (specsoak_engine_buffer_bytes)", "model + KV + compute (+ recurrent) buffers of target and draft"),
    Record(
        "specsoak:engine_acceptance_ratio:rate1m",
        f"{_rate('llamacpp:spec_decode_num_accepted_tokens_total', '1m')} / {_rate('llamacpp:spec_decode_num_draft_tokens_total', '1m')}",
        "acceptance from the engine's own counters (updated per finished request)",
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
    Alert("SpecsoakEngineDown", f"min by ({BY}) (specsoak_engine_up)", "<", 1, "30s", "critical", "{{ $labels.config }}: the engine process is gone while it is being measured"),
    Alert("SpecsoakEngineScrapeDown", f'min by ({BY}) (up{{job="{ENGINES_JOB}"}})', "<", 1, "1m", "warning", "{{ $labels.config }}: the engine's /metrics cannot be scraped"),
    Alert("SpecsoakErrorRate", "specsoak:request_error_ratio:rate5m", ">", 0.05, "2m", "critical", "{{ $labels.config }}: more than 5% of requests failed over 5 minutes"),
    Alert(
        "SpecsoakAcceptanceDrift", _ACCEPTANCE_DRIFT, ">", 0.2, "10m", "warning",
        "{{ $labels.config }}: acceptance is more than 20% away from its reference (soak: the change detector's; otherwise the run's measured phases)",
    ),
    Alert(
        "SpecsoakThroughputDrop",
        f"{_max('specsoak_soak_output_tokens_per_second')} / {_SOAK_TPS_REF}",
        "<", 0.8, "10m", "warning", "{{ $labels.config }}: soak output t/s is more than 20% below the change detector's reference",
    ),
    Alert(
        "SpecsoakRssCreep",
        f"max by ({BY}) (specsoak_engine_resident_memory_bytes) / max by ({BY}) (min_over_time(specsoak_engine_resident_memory_bytes[1h]))",
        ">", 1.2, "15m", "warning", "{{ $labels.config }}: engine RSS grew more than 20% over its lowest of the last hour",
    ),
    Alert(
        "SpecsoakCollapse", f"max by ({BY}, metric) (specsoak_soak_collapsed)", "==", 1, "0s", "critical",
        "{{ $labels.config }}: {{ $labels.metric }} collapsed (the soak's change detector is in an episode)",
    ),
    Alert(
        "SpecsoakMemoryExhaustion", f"min by ({BY}) (specsoak_soak_memory_headroom_seconds)", "<", 3600, "2m", "critical",
        "{{ $labels.config }}: at the engine's memory growth the machine's available memory runs out in {{ $value | humanizeDuration }}",
    ),
    Alert(
        "SpecsoakMemoryExhaustionForecast", f"{_RSS_GROWTH_1H} / on (run) group_left {_AVAILABLE}", ">", 1, "15m", "warning",
        "{{ $labels.config }}: engine RSS, extrapolated from its last 30 minutes, grows past the machine's available memory within an hour",
    ),
)


def rules_document() -> dict[str, Any]:
    return {
        "groups": [
            {"name": "specsoak-verdict", "rules": [{"record": r.record, "expr": r.expr} for r in RECORDS]},
            {
                "name": "specsoak-soak",
                "rules": [
                    {"alert": a.name, "expr": a.expr, "for": a.for_, "labels": {"severity": a.severity}, "annotations": {"summary": a.summary}}
                    for a in ALERTS
                ],
            },
        ]
    }


def prometheus_config(
    exporter_targets: list[str],
    engine_sd_files: list[str],
    rule_files: list[str],
    scrape_interval: str = "5s",
    evaluation_interval: str | None = None,
    sd_refresh: str = "5s",
) -> dict[str, Any]:
    """prometheus.yml: the exporter, and every engine listed in the runs' file_sd targets files."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval or scrape_interval},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": EXPORTER_JOB, "static_configs": [{"targets": list(exporter_targets)}]},
            {
                "job_name": ENGINES_JOB,
                "file_sd_configs": [{"files": list(engine_sd_files), "refresh_interval": sd_refresh}],
                "relabel_configs": [
                    # only targets a specsoak run wrote, and name each by run/config rather than host:port
                    {"source_labels": ["run"], "regex": ".+", "action": "keep"},
                    {"source_labels": ["run", "config"], "separator": "/", "target_label": "instance"},
                ],
            },
        ],
    }


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def rule_tests_document(rule_file: str) -> dict[str, Any]:
    """promtool unit tests: each alert fires on a synthetic soak that breaks it, and not before."""
    cfg = {"run": "r1", "config": "spec", "engine": "llamacpp", "algorithm": "draft-simple", "synthetic": "false"}
    base = {**cfg, "config": "base", "algorithm": "none"}
    exp = {**cfg}

    def alert(name: str, at: str, labels: dict[str, str], summary: str) -> list[dict[str, Any]]:
        return [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": {"severity": next(a.severity for a in ALERTS if a.name == name), **labels}, "exp_annotations": {"summary": summary}}]},
        ]

    DRIFT_SUMMARY = "spec: acceptance is more than 20% away from its reference (soak: the change detector's; otherwise the run's measured phases)"

    def quiet(name: str, at: str) -> dict[str, Any]:
        return {"eval_time": at, "alertname": name, "exp_alerts": []}

    req = {**cfg, "phase": "measure"}
    job = {**cfg, "job": "specsoak", "instance": "x"}
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "error rate and recording rules",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_requests_total", {**req, "status": "ok", "error_kind": ""}), "values": "0+3x30"},
                    {"series": _series("specsoak_requests_total", {**req, "status": "error", "error_kind": "timeout"}), "values": "0x10 0+1x20"},
                    {"series": _series("specsoak_draft_tokens_total", cfg), "values": "0+100x30"},
                    {"series": _series("specsoak_accepted_tokens_total", cfg), "values": "0+75x30"},
                    {"series": _series("specsoak_verify_steps_total", cfg), "values": "0+25x30"},
                    {"series": _series("specsoak_output_tokens_total", req), "values": "0+600x30"},
                    {"series": _series("specsoak_output_tokens_total", {**cfg, "phase": "soak"}), "values": "0+1200x30"},
                ],
                "promql_expr_test": [
                    {"expr": "specsoak:request_error_ratio:rate5m", "eval_time": "5m", "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0}]},
                    {"expr": "specsoak:request_error_ratio:rate5m", "eval_time": "20m", "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0.25}]},
                    {"expr": "specsoak:acceptance_ratio:rate5m", "eval_time": "10m", "exp_samples": [{"labels": _series("specsoak:acceptance_ratio:rate5m", exp), "value": 0.75}]},
                    {"expr": "specsoak:mean_acceptance_length:rate5m", "eval_time": "10m", "exp_samples": [{"labels": _series("specsoak:mean_acceptance_length:rate5m", exp), "value": 4}]},
                    {
                        "expr": "specsoak:output_tokens:rate1m",
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": _series("specsoak:output_tokens:rate1m", {**exp, "phase": "measure"}), "value": 10},
                            {"labels": _series("specsoak:output_tokens:rate1m", {**exp, "phase": "soak"}), "value": 20},
                        ],
                    },
                ],
                "alert_rule_test": [quiet("SpecsoakErrorRate", "10m"), *alert("SpecsoakErrorRate", "20m", exp, "spec: more than 5% of requests failed over 5 minutes")],
            },
            {
                "name": "engine down",
                "interval": "15s",
                "input_series": [{"series": _series("specsoak_engine_up", {**cfg, "job": "specsoak", "instance": "x"}), "values": "1x8 0x12"}],
                "alert_rule_test": [quiet("SpecsoakEngineDown", "2m"), *alert("SpecsoakEngineDown", "4m", exp, "spec: the engine process is gone while it is being measured")],
            },
            {
                "name": "acceptance drift",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_draft_tokens_total", cfg), "values": "0+100x60"},
                    {"series": _series("specsoak_accepted_tokens_total", cfg), "values": "0+80x20 1600+40x40"},
                    {"series": _series("specsoak_cumulative_acceptance_ratio", {**cfg, "job": "specsoak", "instance": "x"}), "values": "0.8x60"},
                ],
                "alert_rule_test": [quiet("SpecsoakAcceptanceDrift", "15m"), *alert("SpecsoakAcceptanceDrift", "45m", exp, DRIFT_SUMMARY)],
            },
            {
                "name": "throughput drop: soak window output t/s against the detector's reference",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_soak_output_tokens_per_second", job), "values": "60x30 40x30"},
                    {"series": _series("specsoak_soak_reference", {**job, "metric": "output_tps"}), "values": "60x60"},
                ],
                "alert_rule_test": [
                    quiet("SpecsoakThroughputDrop", "25m"),
                    quiet("SpecsoakThroughputDrop", "38m"),  # below for less than 10 minutes
                    *alert("SpecsoakThroughputDrop", "45m", exp, "spec: soak output t/s is more than 20% below the change detector's reference"),
                ],
            },
            {
                "name": "acceptance drift during a soak: the window against the detector's reference, not the measured phases",
                "interval": "1m",
                "input_series": [
                    # the counters' 5-minute acceptance (0.4) is far from the measured phases' (0.8): ignored during a soak
                    {"series": _series("specsoak_draft_tokens_total", cfg), "values": "0+100x60"},
                    {"series": _series("specsoak_accepted_tokens_total", cfg), "values": "0+40x60"},
                    {"series": _series("specsoak_cumulative_acceptance_ratio", job), "values": "0.8x60"},
                    {"series": _series("specsoak_soak_window_end_time_seconds", job), "values": "0+60x60"},
                    {"series": _series("specsoak_soak_acceptance_ratio", job), "values": "0.4x25 0.25x35"},
                    # no reference during the detector's warm-up (15 minutes): no judgement at all
                    {"series": _series("specsoak_soak_reference", {**job, "metric": "acceptance"}), "values": "_x15 0.4x45"},
                ],
                "alert_rule_test": [
                    quiet("SpecsoakAcceptanceDrift", "14m"),
                    quiet("SpecsoakAcceptanceDrift", "24m"),
                    *alert("SpecsoakAcceptanceDrift", "45m", exp, DRIFT_SUMMARY),
                ],
            },
            {
                "name": "collapse",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_soak_collapsed", {**job, "metric": "decode_tps"}), "values": "0x10 1x5 0x5"},
                    {"series": _series("specsoak_soak_collapsed", {**job, "metric": "acceptance"}), "values": "0x20"},
                ],
                "alert_rule_test": [
                    quiet("SpecsoakCollapse", "9m"),
                    *alert("SpecsoakCollapse", "12m", {**exp, "metric": "decode_tps"}, "spec: decode_tps collapsed (the soak's change detector is in an episode)"),
                    quiet("SpecsoakCollapse", "18m"),  # the episode ended
                ],
            },
            {
                "name": "memory exhaustion: the harness's headroom",
                "interval": "1m",
                "input_series": [{"series": _series("specsoak_soak_memory_headroom_seconds", job), "values": "7200x10 1800x10"}],
                "alert_rule_test": [
                    quiet("SpecsoakMemoryExhaustion", "10m"),
                    *alert("SpecsoakMemoryExhaustion", "15m", exp, "spec: at the engine's memory growth the machine's available memory runs out in 30m 0s"),
                ],
            },
            {
                "name": "memory exhaustion: PromQL's forecast of RSS against available memory",
                "interval": "1m",
                "input_series": [
                    # flat for 30 minutes, then 10 MB a minute (600 MB an hour) with 400 MB available
                    {"series": _series("specsoak_engine_resident_memory_bytes", job), "values": "1000000000x30 1000000000+10000000x60"},
                    {"series": _series("specsoak_machine_memory_bytes", {"run": "r1", "kind": "available", "job": "specsoak", "instance": "x"}), "values": "400000000x90"},
                ],
                "alert_rule_test": [
                    quiet("SpecsoakMemoryExhaustionForecast", "30m"),
                    *alert("SpecsoakMemoryExhaustionForecast", "80m", exp, "spec: engine RSS, extrapolated from its last 30 minutes, grows past the machine's available memory within an hour"),
                ],
            },
            {
                "name": "rss creep",
                "interval": "1m",
                "input_series": [{"series": _series("specsoak_engine_resident_memory_bytes", {**cfg, "job": "specsoak", "instance": "x"}), "values": "1000000000+10000000x60"}],
                "alert_rule_test": [quiet("SpecsoakRssCreep", "15m"), *alert("SpecsoakRssCreep", "50m", exp, "spec: engine RSS grew more than 20% over its lowest of the last hour")],
            },
            {
                "name": "vs baseline",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_total_tokens_per_second", {**base, "streams": "4", "job": "specsoak", "instance": "x"}), "values": "50x10"},
                    {"series": _series("specsoak_total_tokens_per_second", {**cfg, "streams": "4", "job": "specsoak", "instance": "x"}), "values": "25x10"},
                ],
                "promql_expr_test": [
                    {
                        "expr": "specsoak:total_tokens_per_second:vs_baseline",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": _series("specsoak:total_tokens_per_second:vs_baseline", {**base, "streams": "4"}), "value": 1},
                            {"labels": _series("specsoak:total_tokens_per_second:vs_baseline", {**cfg, "streams": "4"}), "value": 0.5},
                        ],
                    }
                ],
            },
        ],
    }


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=200)
