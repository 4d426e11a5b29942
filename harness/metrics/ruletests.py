"""promtool unit tests of the generated rules (dashboards/prometheus/rules.test.yml): each alert fires on a
synthetic soak that breaks it, and not before; each engine's own series give the engine-neutral outputs."""

from __future__ import annotations

from typing import Any

from engines.promql import BY_LABELS
from harness.metrics.rules import (
    ALERTS,
    ENGINE_ACCEPTANCE,
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_DRAFT_TOKENS,
    ENGINE_KV_USAGE,
    ENGINE_OUTPUTS,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
)
from harness.metrics.scrape import ENGINES_JOB


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _engine_case(
    engine: str, title: str, series: list[tuple[str, dict[str, str], str]], expect: dict[str, float]
) -> dict[str, Any]:
    """One engine's own series, named and labelled as Prometheus stores its scrape (the file_sd target's
    labels win, an engine's clashing label becomes ``exported_*``), against every engine-neutral output:
    ``expect``'s value, or no series at all."""
    target = {
        "run": "r1",
        "config": "spec",
        "engine": engine,
        "algorithm": "draft-eagle3",
        "synthetic": "false",
        "job": ENGINES_JOB,
        "instance": "r1/spec",
    }
    out = {k: target[k] for k in BY_LABELS}
    return {
        "name": f"engine series: {engine}, {title}",
        "interval": "15s",
        "input_series": [
            {"series": _series(name, {**target, **own}), "values": values} for name, own, values in series
        ],
        "promql_expr_test": [
            {
                "expr": f'{o.record}{{engine="{engine}"}}',
                "eval_time": "5m",
                "exp_samples": [{"labels": _series(o.record, out), "value": expect[o.record]}]
                if o.record in expect
                else [],
            }
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
        _engine_case(
            "llamacpp",
            "all series",
            [
                ("llamacpp:spec_decode_num_draft_tokens_total", {}, "0+60x40"),
                ("llamacpp:spec_decode_num_accepted_tokens_total", {}, "0+45x40"),
                ("llamacpp:spec_decode_num_drafts_total", {}, "0+30x40"),
                ("llamacpp:requests_processing", {}, "2x40"),
                ("llamacpp:requests_deferred", {}, "1x40"),
            ],
            {d: 4, a: 3, v: 2, ratio: 0.75, run: 2, wait: 1},
        ),
        _engine_case(
            "vllm",
            "two data-parallel engines",
            [
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
            ],
            {d: 4, a: 3, v: 2, ratio: 0.75, run: 3, wait: 1, kv: 0.5},
        ),
        _engine_case(
            "vllm",
            "V0: steps = emitted - accepted",
            [
                ("vllm:spec_decode_num_draft_tokens_total", m, "0+60x40"),
                ("vllm:spec_decode_num_accepted_tokens_total", m, "0+45x40"),
                ("vllm:spec_decode_num_emitted_tokens_total", m, "0+75x40"),
            ],
            {d: 4, a: 3, v: 2, ratio: 0.75},
        ),
        _engine_case(
            "sglang",
            "accepted = generated - steps - requests",
            [
                ("sglang:generation_tokens_total", m, "0+82.5x40"),
                ("sglang:spec_verify_calls_total", m, "0+30x40"),
                ("sglang:num_requests_total", m, "0+7.5x40"),
                ("sglang:spec_accept_rate", m, "0.75x40"),
                ("sglang:num_running_reqs", m, "3x40"),
                ("sglang:num_queue_reqs", m, "2x40"),
                ("sglang:token_usage", m, "0.5x40"),
            ],
            {a: 3, v: 2, ratio: 0.75, run: 3, wait: 2, kv: 0.5},
        ),
        _engine_case(
            "sglang",
            "no speculation: nothing accepted",
            [
                ("sglang:generation_tokens_total", m, "0+60x40"),
                ("sglang:spec_verify_calls_total", m, "0x40"),
                ("sglang:num_requests_total", m, "0+7.5x40"),
            ],
            {a: 0, v: 0},
        ),
        _engine_case(
            "sglang",
            "older, without the requests counter",
            [
                ("sglang:generation_tokens_total", m, "0+75x40"),
                ("sglang:spec_verify_calls_total", m, "0+30x40"),
            ],
            {a: 3, v: 2},
        ),
        _engine_case(
            "trtllm",
            "steps = generated - accepted - requests",
            [
                ("trtllm_spec_decode_num_draft_tokens_total", trt, "0+60x40"),
                ("trtllm_spec_decode_num_accepted_tokens_total", trt, "0+45x40"),
                ("trtllm_generation_tokens_total", trt, "0+82.5x40"),
                ("trtllm_request_success_total", {**trt, "finished_reason": "length"}, "0+4.5x40"),
                ("trtllm_request_success_total", {**trt, "finished_reason": "stop"}, "0+3x40"),
                ("trtllm_num_requests_running", trt, "3x40"),
                ("trtllm_num_requests_waiting", trt, "1x40"),
                ("trtllm_kv_cache_utilization", trt, "0.5x40"),
            ],
            {d: 4, a: 3, v: 2, ratio: 0.75, run: 3, wait: 1, kv: 0.5},
        ),
        _engine_case(
            "trtllm",
            "per-position counters: steps = drafts at position 0",
            [
                ("trtllm_spec_decode_drafted_tokens_total", {**m, "token_position": "0"}, "0+30x40"),
                ("trtllm_spec_decode_drafted_tokens_total", {**m, "token_position": "1"}, "0+30x40"),
                ("trtllm_spec_decode_accepted_tokens_total", {**m, "token_position": "0"}, "0+27x40"),
                ("trtllm_spec_decode_accepted_tokens_total", {**m, "token_position": "1"}, "0+18x40"),
                ("trtllm_generation_tokens_total", m, "0+90x40"),
            ],
            {d: 4, a: 3, v: 2, ratio: 0.75},
        ),
        _engine_case(
            "tgi",
            "steps = skipped-token observations - requests",
            [
                ("tgi_request_skipped_tokens_count", {}, "0+37.5x40"),
                ("tgi_request_skipped_tokens_sum", {}, "0+45x40"),
                ("tgi_request_generated_tokens_count", {}, "0+7.5x40"),
                ("tgi_batch_current_size", {}, "3x40"),
                ("tgi_queue_size", {}, "1x40"),
            ],
            {a: 3, v: 2, run: 3, wait: 1},
        ),
    ]


def rule_tests_document(rule_file: str) -> dict[str, Any]:
    """promtool unit tests: each alert fires on a synthetic soak that breaks it, and not before; each
    engine's own series give the engine-neutral outputs."""
    cfg = {"run": "r1", "config": "spec", "engine": "llamacpp", "algorithm": "draft-simple", "synthetic": "false"}
    base = {**cfg, "config": "base", "algorithm": "none"}
    exp = {**cfg}

    def alert(name: str, at: str, labels: dict[str, str], summary: str) -> list[dict[str, Any]]:
        return [
            {
                "eval_time": at,
                "alertname": name,
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": next(a.severity for a in ALERTS if a.name == name), **labels},
                        "exp_annotations": {"summary": summary},
                    }
                ],
            },
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
                    {
                        "series": _series("specsoak_requests_total", {**req, "status": "ok", "error_kind": ""}),
                        "values": "0+3x30",
                    },
                    {
                        "series": _series(
                            "specsoak_requests_total", {**req, "status": "error", "error_kind": "timeout"}
                        ),
                        "values": "0x10 0+1x20",
                    },
                    {"series": _series("specsoak_draft_tokens_total", cfg), "values": "0+100x30"},
                    {"series": _series("specsoak_accepted_tokens_total", cfg), "values": "0+75x30"},
                    {"series": _series("specsoak_verify_steps_total", cfg), "values": "0+25x30"},
                    {"series": _series("specsoak_output_tokens_total", req), "values": "0+600x30"},
                    {
                        "series": _series("specsoak_output_tokens_total", {**cfg, "phase": "soak"}),
                        "values": "0+1200x30",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": "specsoak:request_error_ratio:rate5m",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0}],
                    },
                    {
                        "expr": "specsoak:request_error_ratio:rate5m",
                        "eval_time": "20m",
                        "exp_samples": [{"labels": _series("specsoak:request_error_ratio:rate5m", exp), "value": 0.25}],
                    },
                    {
                        "expr": "specsoak:acceptance_ratio:rate5m",
                        "eval_time": "10m",
                        "exp_samples": [{"labels": _series("specsoak:acceptance_ratio:rate5m", exp), "value": 0.75}],
                    },
                    {
                        "expr": "specsoak:mean_acceptance_length:rate5m",
                        "eval_time": "10m",
                        "exp_samples": [{"labels": _series("specsoak:mean_acceptance_length:rate5m", exp), "value": 4}],
                    },
                    {
                        "expr": "specsoak:output_tokens:rate1m",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": _series("specsoak:output_tokens:rate1m", {**exp, "phase": "measure"}),
                                "value": 10,
                            },
                            {"labels": _series("specsoak:output_tokens:rate1m", {**exp, "phase": "soak"}), "value": 20},
                        ],
                    },
                ],
                "alert_rule_test": [
                    quiet("SpecsoakErrorRate", "10m"),
                    *alert("SpecsoakErrorRate", "20m", exp, "spec: more than 5% of requests failed over 5 minutes"),
                ],
            },
            {
                "name": "engine down",
                "interval": "15s",
                "input_series": [
                    {
                        "series": _series("specsoak_engine_up", {**cfg, "job": "specsoak", "instance": "x"}),
                        "values": "1x8 0x12",
                    }
                ],
                "alert_rule_test": [
                    quiet("SpecsoakEngineDown", "2m"),
                    *alert(
                        "SpecsoakEngineDown", "4m", exp, "spec: the engine process is gone while it is being measured"
                    ),
                ],
            },
            {
                "name": "acceptance drift",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_draft_tokens_total", cfg), "values": "0+100x60"},
                    {"series": _series("specsoak_accepted_tokens_total", cfg), "values": "0+80x20 1600+40x40"},
                    {
                        "series": _series(
                            "specsoak_cumulative_acceptance_ratio", {**cfg, "job": "specsoak", "instance": "x"}
                        ),
                        "values": "0.8x60",
                    },
                ],
                "alert_rule_test": [
                    quiet("SpecsoakAcceptanceDrift", "15m"),
                    *alert("SpecsoakAcceptanceDrift", "45m", exp, DRIFT_SUMMARY),
                ],
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
                    *alert(
                        "SpecsoakThroughputDrop",
                        "45m",
                        exp,
                        "spec: soak output t/s is more than 20% below the change detector's reference",
                    ),
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
                    {
                        "series": _series("specsoak_soak_reference", {**job, "metric": "acceptance"}),
                        "values": "_x15 0.4x45",
                    },
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
                    {
                        "series": _series("specsoak_soak_collapsed", {**job, "metric": "decode_tps"}),
                        "values": "0x10 1x5 0x5",
                    },
                    {"series": _series("specsoak_soak_collapsed", {**job, "metric": "acceptance"}), "values": "0x20"},
                ],
                "alert_rule_test": [
                    quiet("SpecsoakCollapse", "9m"),
                    *alert(
                        "SpecsoakCollapse",
                        "12m",
                        {**exp, "metric": "decode_tps"},
                        "spec: decode_tps collapsed (the soak's change detector is in an episode)",
                    ),
                    quiet("SpecsoakCollapse", "18m"),  # the episode ended
                ],
            },
            {
                "name": "canary divergence",
                "interval": "1m",
                "input_series": [{"series": _series("specsoak_soak_canary_diverged", job), "values": "0x10 1x10"}],
                "alert_rule_test": [
                    quiet("SpecsoakCanaryDivergence", "9m"),
                    *alert(
                        "SpecsoakCanaryDivergence",
                        "12m",
                        exp,
                        "spec: the output canary's greedy answers diverged from their reference (a divergence verdict)",
                    ),
                ],
            },
            {
                "name": "memory exhaustion: the harness's headroom",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_soak_memory_headroom_seconds", job), "values": "7200x10 1800x10"}
                ],
                "alert_rule_test": [
                    quiet("SpecsoakMemoryExhaustion", "10m"),
                    *alert(
                        "SpecsoakMemoryExhaustion",
                        "15m",
                        exp,
                        "spec: at the engine's memory growth the machine's available memory runs out in 30m 0s",
                    ),
                ],
            },
            {
                "name": "stall: a pause of the engine longer than 5 s in a soak window",
                "interval": "1m",
                "input_series": [
                    {"series": _series("specsoak_soak_longest_chunk_gap_seconds", job), "values": "0.05x10 7x1 0.05x20"}
                ],
                "alert_rule_test": [
                    quiet("SpecsoakStall", "10m"),
                    *alert(
                        "SpecsoakStall",
                        "12m",
                        exp,
                        "spec: a stream waited 7s for the engine between two chunks (a pause of the whole engine)",
                    ),
                    quiet("SpecsoakStall", "25m"),
                ],
            },
            {
                "name": "memory exhaustion: PromQL's forecast of RSS against available memory",
                "interval": "1m",
                "input_series": [
                    # flat for 30 minutes, then 10 MB a minute (600 MB an hour) with 400 MB available
                    {
                        "series": _series("specsoak_engine_resident_memory_bytes", job),
                        "values": "1000000000x30 1000000000+10000000x60",
                    },
                    {
                        "series": _series(
                            "specsoak_machine_memory_bytes",
                            {"run": "r1", "kind": "available", "job": "specsoak", "instance": "x"},
                        ),
                        "values": "400000000x90",
                    },
                ],
                "alert_rule_test": [
                    quiet("SpecsoakMemoryExhaustionForecast", "30m"),
                    *alert(
                        "SpecsoakMemoryExhaustionForecast",
                        "80m",
                        exp,
                        "spec: engine RSS, extrapolated from its last 30 minutes, grows past the machine's available memory within an hour",
                    ),
                ],
            },
            {
                "name": "rss creep",
                "interval": "1m",
                "input_series": [
                    {
                        "series": _series(
                            "specsoak_engine_resident_memory_bytes", {**cfg, "job": "specsoak", "instance": "x"}
                        ),
                        "values": "1000000000+10000000x60",
                    }
                ],
                "alert_rule_test": [
                    quiet("SpecsoakRssCreep", "15m"),
                    *alert(
                        "SpecsoakRssCreep",
                        "50m",
                        exp,
                        "spec: engine RSS grew more than 20% over its lowest of the last hour",
                    ),
                ],
            },
            {
                "name": "vs baseline",
                "interval": "1m",
                "input_series": [
                    {
                        "series": _series(
                            "specsoak_total_tokens_per_second",
                            {**base, "streams": "4", "job": "specsoak", "instance": "x"},
                        ),
                        "values": "50x10",
                    },
                    {
                        "series": _series(
                            "specsoak_total_tokens_per_second",
                            {**cfg, "streams": "4", "job": "specsoak", "instance": "x"},
                        ),
                        "values": "25x10",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": "specsoak:total_tokens_per_second:vs_baseline",
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": _series(
                                    "specsoak:total_tokens_per_second:vs_baseline", {**base, "streams": "4"}
                                ),
                                "value": 1,
                            },
                            {
                                "labels": _series(
                                    "specsoak:total_tokens_per_second:vs_baseline", {**cfg, "streams": "4"}
                                ),
                                "value": 0.5,
                            },
                        ],
                    }
                ],
            },
            *engine_rule_tests(),
        ],
    }
