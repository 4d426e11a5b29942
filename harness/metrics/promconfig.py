"""Generated Prometheus configuration: scrape jobs, recording rules, alerting rules, rule unit tests.

Recording rules compute the verdict figures from the exporter's counters over a window, and map
each engine's own series to one engine-neutral set (``specsoak:engine_*``, ``ENGINE_SERIES``); alerting
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
        "SpecsoakStall", f"max by ({BY}) (max_over_time(specsoak_soak_longest_chunk_gap_seconds[5m]))", ">", 5, "0s", "warning",
        "{{ $labels.config }}: a stream waited {{ $value | humanizeDuration }} for the engine between two chunks (a pause of the whole engine)",
    ),
    Alert(
        "SpecsoakMemoryExhaustionForecast", f"{_RSS_GROWTH_1H} / on (run) group_left {_AVAILABLE}", ">", 1, "15m", "warning",
        "{{ $labels.config }}: engine RSS, extrapolated from its last 30 minutes, grows past the machine's available memory within an hour",
    ),
)


# ---- each engine's own /metrics under one engine-neutral set of names -------------------------
# The engines' series carry the run's labels (the file_sd target, harness/metrics/targets.py); the
# rules below give every engine the same `specsoak:engine_*` series, so one dashboard serves all.
# Names are those the adapters read (engines/*.py normalise_metrics) or that
# ../shared/reference/engines.md cites; an output an engine does not report has no rule for it
# (docs/observability.md's table), so its panel shows nothing rather than a made-up 0.
@dataclass(frozen=True)
class EngineOutput:
    record: str
    help: str


ENGINE_DRAFT_TOKENS = "specsoak:engine_draft_tokens:rate1m"
ENGINE_ACCEPTED_TOKENS = "specsoak:engine_accepted_tokens:rate1m"
ENGINE_VERIFY_STEPS = "specsoak:engine_verify_steps:rate1m"
ENGINE_ACCEPTANCE = "specsoak:engine_acceptance_ratio:rate1m"
ENGINE_RUNNING = "specsoak:engine_requests_running:sum"
ENGINE_WAITING = "specsoak:engine_requests_waiting:sum"
ENGINE_KV_USAGE = "specsoak:engine_kv_cache_usage_ratio:max"
ENGINE_OUTPUTS: tuple[EngineOutput, ...] = (
    EngineOutput(ENGINE_DRAFT_TOKENS, "drafted tokens per second"),
    EngineOutput(ENGINE_ACCEPTED_TOKENS, "accepted drafted tokens per second (no bonus token)"),
    EngineOutput(ENGINE_VERIFY_STEPS, "verification steps per second"),
    EngineOutput(ENGINE_ACCEPTANCE, "accepted / drafted"),
    EngineOutput(ENGINE_RUNNING, "requests being generated now (summed over data-parallel ranks)"),
    EngineOutput(ENGINE_WAITING, "requests queued now"),
    EngineOutput(ENGINE_KV_USAGE, "used share of the KV cache, 0..1 (the fullest pool)"),
)


def _r1(metric: str, sel: str = "") -> str:
    return _rate(metric, "1m", sel)


def _sum(metric: str) -> str:
    return f"sum by ({BY}) ({metric})"


def _or_zero(expr: str, like: str) -> str:
    """``expr``, or 0 with the labels of ``like`` where ``expr`` has no series (an older engine lacks it)."""
    return f"({expr} or {like} * 0)"


def _while_positive(expr: str, gate: str) -> str:
    """``expr`` where ``gate`` > 0, else ``gate`` (0): the adapters' 'nothing drafted, nothing accepted'."""
    return f"((({expr}) and on ({BY}) ({gate} > 0)) or {gate})"


_SGL_VERIFY = _r1("sglang:spec_verify_calls_total")
_TRT_DRAFT = f"({_r1('trtllm_spec_decode_num_draft_tokens_total')} or {_r1('trtllm_spec_decode_drafted_tokens_total')})"
_TRT_ACCEPTED = f"({_r1('trtllm_spec_decode_num_accepted_tokens_total')} or {_r1('trtllm_spec_decode_accepted_tokens_total')})"
_TRT_REQUESTS = f"({_r1('trtllm_request_success_total')} or {_r1('trtllm_num_requests_completed_total')})"
_TRT_GENERATED = _r1("trtllm_generation_tokens_total")
_TRT_POSITION0 = _r1("trtllm_spec_decode_drafted_tokens_total", 'token_position="0"')

# engine -> output -> PromQL over the engine's own series (the same arithmetic as its normalise_metrics)
ENGINE_SERIES: dict[str, dict[str, str]] = {
    "llamacpp": {
        ENGINE_DRAFT_TOKENS: _r1("llamacpp:spec_decode_num_draft_tokens_total"),
        ENGINE_ACCEPTED_TOKENS: _r1("llamacpp:spec_decode_num_accepted_tokens_total"),
        ENGINE_VERIFY_STEPS: _r1("llamacpp:spec_decode_num_drafts_total"),
        ENGINE_ACCEPTANCE: f"{_r1('llamacpp:spec_decode_num_accepted_tokens_total')} / {_r1('llamacpp:spec_decode_num_draft_tokens_total')}",
        ENGINE_RUNNING: _sum("llamacpp:requests_processing"),
        ENGINE_WAITING: _sum("llamacpp:requests_deferred"),
    },
    "vllm": {
        ENGINE_DRAFT_TOKENS: _r1("vllm:spec_decode_num_draft_tokens_total"),
        ENGINE_ACCEPTED_TOKENS: _r1("vllm:spec_decode_num_accepted_tokens_total"),
        # V0 had no drafts counter: every step emits its accepted tokens plus one
        ENGINE_VERIFY_STEPS: f"({_r1('vllm:spec_decode_num_drafts_total')} or ({_r1('vllm:spec_decode_num_emitted_tokens_total')} - {_r1('vllm:spec_decode_num_accepted_tokens_total')}))",
        ENGINE_ACCEPTANCE: f"{_r1('vllm:spec_decode_num_accepted_tokens_total')} / {_r1('vllm:spec_decode_num_draft_tokens_total')}",
        ENGINE_RUNNING: _sum("vllm:num_requests_running"),
        ENGINE_WAITING: _sum("vllm:num_requests_waiting"),
        ENGINE_KV_USAGE: f"max by ({BY}) (vllm:kv_cache_usage_perc)",
    },
    "sglang": {
        # every verification step yields its accepted drafts plus one token; every request's first comes from prefill
        ENGINE_ACCEPTED_TOKENS: _while_positive(
            f"{_r1('sglang:generation_tokens_total')} - {_SGL_VERIFY} - {_or_zero(_r1('sglang:num_requests_total'), _SGL_VERIFY)}", _SGL_VERIFY
        ),
        ENGINE_VERIFY_STEPS: _SGL_VERIFY,
        # drafted tokens are not counted: SGLang's own gauge, its last logging window (40 decode steps)
        ENGINE_ACCEPTANCE: f"max by ({BY}) (sglang:spec_accept_rate)",
        ENGINE_RUNNING: _sum("sglang:num_running_reqs"),
        ENGINE_WAITING: _sum("sglang:num_queue_reqs"),
        ENGINE_KV_USAGE: f"max by ({BY}) (sglang:token_usage)",
    },
    "trtllm": {
        ENGINE_DRAFT_TOKENS: _TRT_DRAFT,
        ENGINE_ACCEPTED_TOKENS: _TRT_ACCEPTED,
        # every step drafts position 0; without per-position counters: generated - accepted - requests
        ENGINE_VERIFY_STEPS: f"({_TRT_POSITION0} or {_while_positive(f'{_TRT_GENERATED} - {_TRT_ACCEPTED} - {_TRT_REQUESTS}', _TRT_DRAFT)})",
        ENGINE_ACCEPTANCE: f"{_TRT_ACCEPTED} / {_TRT_DRAFT}",
        ENGINE_RUNNING: _sum("trtllm_num_requests_running"),
        ENGINE_WAITING: _sum("trtllm_num_requests_waiting"),
        ENGINE_KV_USAGE: f"max by ({BY}) (trtllm_kv_cache_utilization)",
    },
    "tgi": {
        # tgi_request_skipped_tokens: one observation per generation step (0 at prefill), the accepted drafts
        ENGINE_ACCEPTED_TOKENS: _r1("tgi_request_skipped_tokens_sum"),
        ENGINE_VERIFY_STEPS: f"{_r1('tgi_request_skipped_tokens_count')} - {_r1('tgi_request_generated_tokens_count')}",
        ENGINE_RUNNING: _sum("tgi_batch_current_size"),
        ENGINE_WAITING: _sum("tgi_queue_size"),
    },
}


@dataclass(frozen=True)
class EngineRecord:
    engine: str
    record: str
    expr: str


ENGINE_RECORDS: tuple[EngineRecord, ...] = tuple(
    EngineRecord(engine, o.record, series[o.record]) for engine, series in ENGINE_SERIES.items() for o in ENGINE_OUTPUTS if o.record in series
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
                {"name": f"specsoak-engine-{engine}", "rules": [{"record": r.record, "expr": r.expr, "labels": {"engine": engine}} for r in ENGINE_RECORDS if r.engine == engine]}
                for engine in ENGINE_SERIES
            ),
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


def _engine_case(engine: str, title: str, series: list[tuple[str, dict[str, str], str]], expect: dict[str, float]) -> dict[str, Any]:
    """One engine's own series, named and labelled as Prometheus stores its scrape (the file_sd target's
    labels win, an engine's clashing label becomes ``exported_*``), against every engine-neutral output:
    ``expect``'s value, or no series at all."""
    target = {"run": "r1", "config": "spec", "engine": engine, "algorithm": "draft-eagle3", "synthetic": "false", "job": ENGINES_JOB, "instance": "r1/spec"}
    out = {k: target[k] for k in BY_LABELS}
    return {
        "name": f"engine series: {engine}, {title}",
        "interval": "15s",
        "input_series": [{"series": _series(name, {**target, **own}), "values": values} for name, own, values in series],
        "promql_expr_test": [
            {"expr": f'{o.record}{{engine="{engine}"}}', "eval_time": "5m", "exp_samples": [{"labels": _series(o.record, out), "value": expect[o.record]}] if o.record in expect else []}
            for o in ENGINE_OUTPUTS
        ],
    }


def engine_rule_tests() -> list[dict[str, Any]]:
    """Per engine (the first case of each is its full set): counters grow every 15 s, so each rate is
    the increment / 15. Gauges keep their value."""
    d, a, v, ratio = ENGINE_DRAFT_TOKENS, ENGINE_ACCEPTED_TOKENS, ENGINE_VERIFY_STEPS, ENGINE_ACCEPTANCE
    run, wait, kv = ENGINE_RUNNING, ENGINE_WAITING, ENGINE_KV_USAGE
    m = {"model_name": "/models/Llama-3.1-8B-Instruct"}
    trt = {**m, "engine_type": "pytorch"}
    dp0, dp1 = {**m, "exported_engine": "0"}, {**m, "exported_engine": "1"}  # vLLM's own `engine` label
    return [
        _engine_case("llamacpp", "all series", [
            ("llamacpp:spec_decode_num_draft_tokens_total", {}, "0+60x40"),
            ("llamacpp:spec_decode_num_accepted_tokens_total", {}, "0+45x40"),
            ("llamacpp:spec_decode_num_drafts_total", {}, "0+30x40"),
            ("llamacpp:requests_processing", {}, "2x40"),
            ("llamacpp:requests_deferred", {}, "1x40"),
        ], {d: 4, a: 3, v: 2, ratio: 0.75, run: 2, wait: 1}),
        _engine_case("vllm", "two data-parallel engines", [
            ("vllm:spec_decode_num_draft_tokens_total", dp0, "0+30x40"),
            ("vllm:spec_decode_num_draft_tokens_total", dp1, "0+30x40"),
            ("vllm:spec_decode_num_accepted_tokens_total", dp0, "0+15x40"),
            ("vllm:spec_decode_num_accepted_tokens_total", dp1, "0+30x40"),
            ("vllm:spec_decode_num_drafts_total", dp0, "0+15x40"),
            ("vllm:spec_decode_num_drafts_total", dp1, "0+15x40"),
            ("vllm:num_requests_running", dp0, "1x40"),
            ("vllm:num_requests_running", dp1, "2x40"),
            ("vllm:num_requests_waiting", dp0, "0x40"),
            ("vllm:num_requests_waiting", dp1, "1x40"),
            ("vllm:kv_cache_usage_perc", dp0, "0.25x40"),
            ("vllm:kv_cache_usage_perc", dp1, "0.5x40"),
        ], {d: 4, a: 3, v: 2, ratio: 0.75, run: 3, wait: 1, kv: 0.5}),
        _engine_case("vllm", "V0: steps = emitted - accepted", [
            ("vllm:spec_decode_num_draft_tokens_total", m, "0+60x40"),
            ("vllm:spec_decode_num_accepted_tokens_total", m, "0+45x40"),
            ("vllm:spec_decode_num_emitted_tokens_total", m, "0+75x40"),
        ], {d: 4, a: 3, v: 2, ratio: 0.75}),
        _engine_case("sglang", "accepted = generated - steps - requests", [
            ("sglang:generation_tokens_total", m, "0+82.5x40"),
            ("sglang:spec_verify_calls_total", m, "0+30x40"),
            ("sglang:num_requests_total", m, "0+7.5x40"),
            ("sglang:spec_accept_rate", m, "0.75x40"),
            ("sglang:num_running_reqs", m, "3x40"),
            ("sglang:num_queue_reqs", m, "2x40"),
            ("sglang:token_usage", m, "0.5x40"),
        ], {a: 3, v: 2, ratio: 0.75, run: 3, wait: 2, kv: 0.5}),
        _engine_case("sglang", "no speculation: nothing accepted", [
            ("sglang:generation_tokens_total", m, "0+60x40"),
            ("sglang:spec_verify_calls_total", m, "0x40"),
            ("sglang:num_requests_total", m, "0+7.5x40"),
        ], {a: 0, v: 0}),
        _engine_case("sglang", "older, without the requests counter", [
            ("sglang:generation_tokens_total", m, "0+75x40"),
            ("sglang:spec_verify_calls_total", m, "0+30x40"),
        ], {a: 3, v: 2}),
        _engine_case("trtllm", "steps = generated - accepted - requests", [
            ("trtllm_spec_decode_num_draft_tokens_total", trt, "0+60x40"),
            ("trtllm_spec_decode_num_accepted_tokens_total", trt, "0+45x40"),
            ("trtllm_generation_tokens_total", trt, "0+82.5x40"),
            ("trtllm_request_success_total", {**trt, "finished_reason": "length"}, "0+4.5x40"),
            ("trtllm_request_success_total", {**trt, "finished_reason": "stop"}, "0+3x40"),
            ("trtllm_num_requests_running", trt, "3x40"),
            ("trtllm_num_requests_waiting", trt, "1x40"),
            ("trtllm_kv_cache_utilization", trt, "0.5x40"),
        ], {d: 4, a: 3, v: 2, ratio: 0.75, run: 3, wait: 1, kv: 0.5}),
        _engine_case("trtllm", "per-position counters: steps = drafts at position 0", [
            ("trtllm_spec_decode_drafted_tokens_total", {**m, "token_position": "0"}, "0+30x40"),
            ("trtllm_spec_decode_drafted_tokens_total", {**m, "token_position": "1"}, "0+30x40"),
            ("trtllm_spec_decode_accepted_tokens_total", {**m, "token_position": "0"}, "0+27x40"),
            ("trtllm_spec_decode_accepted_tokens_total", {**m, "token_position": "1"}, "0+18x40"),
            ("trtllm_generation_tokens_total", m, "0+90x40"),
        ], {d: 4, a: 3, v: 2, ratio: 0.75}),
        _engine_case("tgi", "steps = skipped-token observations - requests", [
            ("tgi_request_skipped_tokens_count", {}, "0+37.5x40"),
            ("tgi_request_skipped_tokens_sum", {}, "0+45x40"),
            ("tgi_request_generated_tokens_count", {}, "0+7.5x40"),
            ("tgi_batch_current_size", {}, "3x40"),
            ("tgi_queue_size", {}, "1x40"),
        ], {a: 3, v: 2, run: 3, wait: 1}),
    ]


def rule_tests_document(rule_file: str) -> dict[str, Any]:
    """promtool unit tests: each alert fires on a synthetic soak that breaks it, and not before; each
    engine's own series give the engine-neutral outputs."""
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
                "name": "stall: a pause of the engine longer than 5 s in a soak window",
                "interval": "1m",
                "input_series": [{"series": _series("specsoak_soak_longest_chunk_gap_seconds", job), "values": "0.05x10 7x1 0.05x20"}],
                "alert_rule_test": [
                    quiet("SpecsoakStall", "10m"),
                    *alert("SpecsoakStall", "12m", exp, "spec: a stream waited 7s for the engine between two chunks (a pause of the whole engine)"),
                    quiet("SpecsoakStall", "25m"),
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
            *engine_rule_tests(),
        ],
    }


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=200)
