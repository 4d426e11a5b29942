"""Generated Prometheus configuration: scrape jobs, recording rules, alerting rules, rule unit tests.

Recording rules compute the verdict figures from the exporter's counters over a window; alerting
rules are the soak verdicts. Every alert is written as ``VALUE OP THRESHOLD``: ``Alert.value`` is
the ratio or series it watches, which is never empty while a run is scraped, so the integration
test evaluates it (an alert's own expression is normally empty, and must be).
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


_REQUESTS = _rate("specsoak_requests_total", "5m")
_ERRORS = _rate("specsoak_requests_total", "5m", 'status="error"')

RECORDS: tuple[Record, ...] = (
    Record("specsoak:output_tokens:rate1m", _rate("specsoak_output_tokens_total", "1m", 'phase="measure"'), "output t/s of measured requests, all streams together"),
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
    Record("specsoak:request_ttft_seconds:p50_5m", f"histogram_quantile(0.5, sum by ({BY}, le) (rate(specsoak_request_ttft_seconds_bucket{{phase=\"measure\"}}[5m])))", "median TTFT"),
    Record("specsoak:request_ttft_seconds:p99_5m", f"histogram_quantile(0.99, sum by ({BY}, le) (rate(specsoak_request_ttft_seconds_bucket{{phase=\"measure\"}}[5m])))", "p99 TTFT"),
    Record("specsoak:request_inter_token_seconds:p99_5m", f"histogram_quantile(0.99, sum by ({BY}, le) (rate(specsoak_request_inter_token_seconds_bucket{{phase=\"measure\"}}[5m])))", "p99 inter-token gap"),
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

_CUM = f"max by ({BY}) (specsoak_cumulative_acceptance_ratio)"
ALERTS: tuple[Alert, ...] = (
    Alert("SpecsoakEngineDown", f"min by ({BY}) (specsoak_engine_up)", "<", 1, "30s", "critical", "{{ $labels.config }}: the engine process is gone while it is being measured"),
    Alert("SpecsoakEngineScrapeDown", f'min by ({BY}) (up{{job="{ENGINES_JOB}"}})', "<", 1, "1m", "warning", "{{ $labels.config }}: the engine's /metrics cannot be scraped"),
    Alert("SpecsoakErrorRate", "specsoak:request_error_ratio:rate5m", ">", 0.05, "2m", "critical", "{{ $labels.config }}: more than 5% of requests failed over 5 minutes"),
    Alert("SpecsoakAcceptanceDrift", f"abs(specsoak:acceptance_ratio:rate5m - {_CUM}) / {_CUM}", ">", 0.2, "10m", "warning", "{{ $labels.config }}: acceptance over 5 minutes is more than 20% away from the run's"),
    Alert(
        "SpecsoakThroughputDrop",
        f"max by ({BY}, streams) (specsoak_phase_total_tokens_per_second) / max by ({BY}, streams) (max_over_time(specsoak_phase_total_tokens_per_second[1h]))",
        "<", 0.8, "10m", "warning", "{{ $labels.config }} @{{ $labels.streams }} streams: total t/s is more than 20% below the best of the last hour",
    ),
    Alert(
        "SpecsoakRssCreep",
        f"max by ({BY}) (specsoak_engine_resident_memory_bytes) / max by ({BY}) (min_over_time(specsoak_engine_resident_memory_bytes[1h]))",
        ">", 1.2, "15m", "warning", "{{ $labels.config }}: engine RSS grew more than 20% over its lowest of the last hour",
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

    def quiet(name: str, at: str) -> dict[str, Any]:
        return {"eval_time": at, "alertname": name, "exp_alerts": []}

    req = {**cfg, "phase": "measure"}
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
                ],
                "promql_expr_test": [
                    {"expr": "specsoak:request_error_ratio:rate5m", "eval_time": "5m", "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0}]},
                    {"expr": "specsoak:request_error_ratio:rate5m", "eval_time": "20m", "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0.25}]},
                    {"expr": "specsoak:acceptance_ratio:rate5m", "eval_time": "10m", "exp_samples": [{"labels": _series("specsoak:acceptance_ratio:rate5m", exp), "value": 0.75}]},
                    {"expr": "specsoak:mean_acceptance_length:rate5m", "eval_time": "10m", "exp_samples": [{"labels": _series("specsoak:mean_acceptance_length:rate5m", exp), "value": 4}]},
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
                "alert_rule_test": [quiet("SpecsoakAcceptanceDrift", "15m"), *alert("SpecsoakAcceptanceDrift", "45m", exp, "spec: acceptance over 5 minutes is more than 20% away from the run's")],
            },
            {
                "name": "throughput drop",
                "interval": "1m",
                "input_series": [{"series": _series("specsoak_phase_total_tokens_per_second", {**cfg, "streams": "4", "job": "specsoak", "instance": "x"}), "values": "60x20 40x30"}],
                "alert_rule_test": [quiet("SpecsoakThroughputDrop", "20m"), *alert("SpecsoakThroughputDrop", "40m", {**exp, "streams": "4"}, "spec @4 streams: total t/s is more than 20% below the best of the last hour")],
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
