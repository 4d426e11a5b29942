"""Memory (servable context, fill check, GPU) and max streams under the SLO, per configuration."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.common.stats import isnum, number_or_none
from harness.detect.servable import kv_kib_per_token, servable_context, slo_verdict
from harness.probe.gpu import MIB
from harness.records.types import ConfigState
from harness.report.load import RunData


def memory_table(runs: list[RunData], budget_override_mib: float | None = None) -> pd.DataFrame:
    """Seed 000's DFlash table: what each configuration costs in memory, from the start-up log."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        budget = budget_override_mib or number_or_none((run.scenario.get("report") or {}).get("memory_budget_mib"))
        # a fill check belongs to the budget it was made for: none under another budget
        fills = {f["config"]: f for f in run.fill_checks if f.get("budget_mib") == budget} if budget else {}
        for name in run.config_names:
            cap = run.capacity.get(name)
            meta = run.manifest.configurations.get(name) or ConfigState()
            row: dict[str, Any] = {
                "run": run.run_id,
                "config": name,
                "algorithm": meta.get("algorithm"),
                "synthetic": bool(meta.get("synthetic")),
                "memory_budget_mib": budget,
            }
            row.update(_gpu_columns(run, name))
            if not cap:
                rows.append(row)
                continue
            t = cap.get("target") or {}
            d = cap.get("draft") or {}
            ctx = cap.get("ctx_total")
            row.update(
                target_weights_mib=number_or_none(t.get("model_mib")),
                drafter_weights_mib=number_or_none(d.get("model_mib")) if d else 0.0,
                target_kv_mib=number_or_none(t.get("kv_mib")),
                draft_kv_mib=number_or_none(d.get("kv_mib")) if d else 0.0,
                target_kv_kib_per_token=kv_kib_per_token(t.get("kv_mib"), ctx),
                draft_kv_kib_per_token=kv_kib_per_token(d.get("kv_mib"), ctx) if d else 0.0,
                compute_mib=(number_or_none(t.get("compute_mib")) or 0.0)
                + (number_or_none(d.get("compute_mib")) or 0.0),
                draft_compute_mib=number_or_none(d.get("compute_mib")) if d else 0.0,
                recurrent_mib=(number_or_none(t.get("recurrent_mib")) or 0.0)
                + (number_or_none(d.get("recurrent_mib")) or 0.0),
                recurrent_cells=t.get("recurrent_cells"),
                slots=cap.get("slots"),
                ctx_total=cap.get("ctx_total"),
                ctx_per_slot=cap.get("ctx_per_slot"),
            )
            sv = servable_context(cap, budget)
            fixed = sum(
                row[k] or 0.0 for k in ("target_weights_mib", "drafter_weights_mib", "compute_mib", "recurrent_mib")
            )
            row["fixed_mib"] = fixed
            row["kv_kib_per_token"] = sv.kv_kib_per_token if sv else None
            row["total_mib"] = fixed + (row["target_kv_mib"] or 0.0) + (row["draft_kv_mib"] or 0.0)
            row["servable_ctx_total"] = sv.ctx_total if sv else None
            row["servable_ctx_per_slot"] = sv.ctx_per_slot if sv else None
            row.update(_fill_columns(fills.get(name)))
            rows.append(row)
    df = pd.DataFrame(rows)
    for run_id in df["run"].unique() if not df.empty else []:
        sel = df["run"] == run_id
        base = df[sel & (df["algorithm"] == "none")]
        if not base.empty and "servable_ctx_total" in df and isnum(base["servable_ctx_total"].iloc[0]):
            b = float(base["servable_ctx_total"].iloc[0])
            df.loc[sel, "servable_ctx_vs_baseline"] = (
                df.loc[sel, "servable_ctx_total"].astype("float64") / b if b else None
            )
    return df


def _fill_columns(fill: dict[str, Any] | None) -> dict[str, Any]:
    """The fill check of a configuration (harness/session/fillcheck.py) as memory-table columns."""
    if not fill:
        return {"fill_check": "not run"}
    out: dict[str, Any] = {
        "fill_check": fill.get("status"),
        "fill_started_ctx_total": fill.get("started_ctx_total"),
        "fill_ctx_per_slot": fill.get("engine_ctx_per_slot"),
        "fill_tokens_per_slot": fill.get("min_tokens_filled"),
        "fill_log_total_mib": fill.get("log_total_mib"),
        "fill_rss_peak_mib": fill.get("rss_peak_mib"),
        "fill_overflow_refused": fill.get("overflow_refused"),
        "fill_detail": fill.get("detail"),
    }
    return out


def _gpu_columns(run: RunData, name: str) -> dict[str, Any]:
    """Peak GPU memory over a configuration's measurement phases (their ``gpu`` field: harness/probe/gpu.py's
    ``GpuSample.to_dict()``); ``None`` (n/a) where no phase sampled it, never 0, and ``gpu_note`` says why."""
    ph = run.phases
    samples = (
        [g for g in ph.loc[ph["config"] == name, "gpu"] if isinstance(g, dict)] if not ph.empty and "gpu" in ph else []
    )
    seen = [g for g in samples if g.get("available") and isnum(g.get("used_bytes"))]
    engine = [float(g["process_bytes"]) for g in seen if isnum(g.get("process_bytes"))]
    peak = lambda vals: max(vals) / MIB if vals else None
    if not samples:
        note: str | None = "no GPU sample recorded"
    elif not seen:
        note = str(next((g.get("why") for g in samples if g.get("why")), "GPU unavailable"))
    elif not engine:
        note = "engine: " + str(next((g.get("process_why") for g in seen if g.get("process_why")), "not reported"))
    else:
        note = None
    return {
        "gpu_used_mib": peak([float(g["used_bytes"]) for g in seen]),
        "gpu_total_mib": peak([float(g["total_bytes"]) for g in seen if isnum(g.get("total_bytes"))]),
        "engine_gpu_mib": peak(engine),
        "gpu_phases": len(seen),
        "gpu_note": note,
    }


# ---- max streams under the SLO ----------------------------------------------------------------
def max_streams_table(runs: list[RunData], slo_override: dict[str, float] | None = None) -> pd.DataFrame:
    """The largest N meeting the SLO: from the run's adaptive ramp (ramp.jsonl) where it has one and the
    SLO is the one the ramp used, else the largest measured N at which it and every smaller one passed."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        slo = dict(slo_override or run.scenario.get("slo") or {})
        tps_min = number_or_none(slo.get("per_stream_tps_min"))
        ttft_max = number_or_none(slo.get("ttft_p95_s_max"))
        rq = run.requests
        ramp_steps: dict[str, list[dict[str, Any]]] = {}
        for rec in run.ramp:
            if rec.get("event") == "step":
                ramp_steps.setdefault(rec["config"], []).append(rec)
        for name in run.config_names:
            meta = run.manifest.configurations.get(name) or ConfigState()
            cap = run.capacity.get(name, {})
            steps = _ramp_steps(rq, name, ramp_steps.get(name, []))
            source = "adaptive ramp" if steps else "measured stream counts"
            if not steps:
                r = rq[(rq["config"] == name) & (rq["phase"] == "measure")] if not rq.empty else rq
                steps = (
                    [(int(n), r[r["streams"] == n]) for n in sorted(int(n) for n in r["streams"].unique())]
                    if not r.empty
                    else []
                )
            best, broke, at_best, evidence, passed_any_above = _max_streams_of(
                steps, tps_min, ttft_max, ramped=source == "adaptive ramp"
            )
            tried = [n for n, _ in steps]
            ramp_max = ((run.scenario.get("slo") or {}).get("ramp") or {}).get("max_streams")
            rows.append(
                {
                    "run": run.run_id,
                    "config": name,
                    "algorithm": meta.get("algorithm"),
                    "synthetic": bool(meta.get("synthetic")),
                    "slo_per_stream_tps_min": tps_min,
                    "slo_ttft_p95_s_max": ttft_max,
                    "slo_source": "override"
                    if slo_override
                    else ("scenario" if (tps_min or ttft_max) else "none: no failed request"),
                    "max_streams_source": source,
                    "max_streams": best,
                    # every N tried passed: the real limit is higher (for a ramp: it reached its max_streams)
                    "max_streams_is_lower_bound": bool(tried) and not broke,
                    "largest_measured_streams": max(tried) if tried else None,
                    "ramp_max_streams": ramp_max if source == "adaptive ramp" else None,
                    "per_stream_tps_at_max": at_best.get("per_stream_tps"),
                    "ttft_p95_s_at_max": at_best.get("ttft_p95_s"),
                    "first_failing": broke or None,
                    "passed_above_first_failure": ", ".join(passed_any_above) or None,
                    "slots": cap.get("slots"),
                    "evidence": evidence,
                }
            )
    return pd.DataFrame(rows)


def _ramp_steps(rq: pd.DataFrame, name: str, steps: list[dict[str, Any]]) -> list[tuple[int, pd.DataFrame]]:
    """The ramp's stream counts in the order tried, each with its requests (phase 'ramp')."""
    if not steps or rq.empty or "attempt" not in rq:
        return []
    r = rq[(rq["config"] == name) & (rq["phase"] == "ramp")]
    return [(int(s["streams"]), r[r["attempt"] == s["attempt"]]) for s in steps]


def _max_streams_of(
    steps: list[tuple[int, pd.DataFrame]], tps_min: float | None, ttft_max: float | None, ramped: bool
) -> tuple[int | None, str, dict[str, Any], str, list[str]]:
    """Measured counts: walk up, stop at the first failure. A ramp (doubling, then bisection): the
    largest N that passed below the smallest N that failed; an N that passed above it is named."""
    best: int | None = 0 if steps else None
    evidence: list[str] = []
    verdicts: dict[int, Any] = {}
    for n, rn in steps:
        v = slo_verdict(
            zip(rn["status"], rn.get("decode_tps", [None] * len(rn)), rn.get("ttft_s", [None] * len(rn)), strict=True),
            tps_min,
            ttft_max,
        )
        verdicts[n] = v
        evidence.append(v.evidence(n))
        if not ramped and not v.passed:
            break
    failing = sorted(n for n, v in verdicts.items() if not v.passed)
    first_fail = failing[0] if failing else None
    passing = sorted(n for n, v in verdicts.items() if v.passed and (first_fail is None or n < first_fail))
    if passing:
        best = passing[-1]
    above = [
        f"N={n} passed" for n, v in sorted(verdicts.items()) if v.passed and first_fail is not None and n > first_fail
    ]
    broke = f"N={first_fail}: {verdicts[first_fail].why}" if first_fail is not None else ""
    at_best = {"per_stream_tps": verdicts[best].per_stream_tps, "ttft_p95_s": verdicts[best].ttft_p95_s} if best else {}
    return best, broke, at_best, "; ".join(evidence), above
