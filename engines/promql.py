"""The engine-neutral series an engine's own /metrics maps to in Prometheus, and the PromQL to write that mapping in.

Each adapter's ``promql_series`` says, for the outputs its engine reports, how to compute them from the engine's
own series: the same arithmetic as its ``normalise_metrics``. harness/metrics/rules.py makes them recording
rules (``specsoak:engine_*``), so one dashboard serves every engine. An output an engine does not report has no
entry, so its panel shows nothing rather than a made-up 0. Names: each adapter's
module docstring, with the engine version it was read from.
"""

from __future__ import annotations

# the labels of a run's engine scrape target (harness/metrics/targets.py): every output keeps them
BY_LABELS = ("run", "config", "engine", "algorithm", "synthetic")
BY = ", ".join(BY_LABELS)

ENGINE_DRAFT_TOKENS = "specsoak:engine_draft_tokens:rate1m"
ENGINE_ACCEPTED_TOKENS = "specsoak:engine_accepted_tokens:rate1m"
ENGINE_VERIFY_STEPS = "specsoak:engine_verify_steps:rate1m"
ENGINE_ACCEPTANCE = "specsoak:engine_acceptance_ratio:rate1m"
ENGINE_RUNNING = "specsoak:engine_requests_running:sum"
ENGINE_WAITING = "specsoak:engine_requests_waiting:sum"
ENGINE_KV_USAGE = "specsoak:engine_kv_cache_usage_ratio:max"


def rate(metric: str, window: str, sel: str = "") -> str:
    """Per-second rate of a counter over ``window``, summed by the run's labels."""
    return f"sum by ({BY}) (rate({metric}{{{sel}}}[{window}]))" if sel else f"sum by ({BY}) (rate({metric}[{window}]))"


def r1(metric: str, sel: str = "") -> str:
    """``rate`` over one minute: the engine outputs' window."""
    return rate(metric, "1m", sel)


def sum_by(metric: str) -> str:
    return f"sum by ({BY}) ({metric})"


def max_by(metric: str) -> str:
    return f"max by ({BY}) ({metric})"


def or_zero(expr: str, like: str) -> str:
    """``expr``, or 0 with the labels of ``like`` where ``expr`` has no series (an older engine lacks it)."""
    return f"({expr} or {like} * 0)"


def while_positive(expr: str, gate: str) -> str:
    """``expr`` where ``gate`` > 0, else ``gate`` (0): the adapters' 'nothing drafted, nothing accepted'."""
    return f"((({expr}) and on ({BY}) ({gate} > 0)) or {gate})"
