"""The report's tables beside the verdict: memory, max streams, soak, break-even, explanation, losslessness.

Each function takes run data (and the verdict table where it needs it) and returns one data
frame with unit-carrying column names; ``build.py`` writes each as CSV and Parquet and shows
it. Every column is defined in docs/metrics.md.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pandas as pd

from engines.base import EngineCounters, acceptance_figures

from harness.soak.canary import canary_cell
from harness.soak.figures import stall_trend
from harness.probe.gpu import MIB
from harness.report.load import RunData
from harness.common.stats import break_even, expected_tokens_per_step, isnum, shown_difference, t_interval
from harness.config.policy import ENGINE_FAILURES, verdict_fails
from harness.detect.servable import kv_kib_per_token, servable_context, slo_verdict

WATCHDOG_FAILURES = (*ENGINE_FAILURES, "collapse", "memory")  # the verdicts the soak table counts as failures ("engine KIND")


def _cfg_meta(run: RunData, name: str) -> dict[str, Any]:
    """The configuration as run: the manifest's expanded copy (sweeps expanded), else the scenario's."""
    spec = ((run.manifest.get("configurations") or {}).get(name) or {}).get("spec")
    if spec:
        return dict(spec)
    for c in run.scenario.get("configurations") or []:
        if c.get("name") == name:
            return dict(c)
    return {}


def _num(v: Any) -> float | None:
    return float(v) if isnum(v) else None


# ---- memory ----------------------------------------------------------------------------------
def memory_table(runs: list[RunData], budget_override_mib: float | None = None) -> pd.DataFrame:
    """Seed 000's DFlash table: what each configuration costs in memory, from the start-up log."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        budget = budget_override_mib or _num((run.scenario.get("report") or {}).get("memory_budget_mib"))
        # a fill check belongs to the budget it was made for: none under another budget
        fills = {f["config"]: f for f in run.fill_checks if f.get("budget_mib") == budget} if budget else {}
        for name in run.config_names:
            cap = run.capacity.get(name)
            meta = run.manifest.get("configurations", {}).get(name, {})
            row: dict[str, Any] = {"run": run.run_id, "config": name, "algorithm": meta.get("algorithm"),
                                   "synthetic": bool(meta.get("synthetic")), "memory_budget_mib": budget}
            row.update(_gpu_columns(run, name))
            if not cap:
                rows.append(row)
                continue
            t = cap.get("target") or {}
            d = cap.get("draft") or {}
            ctx = cap.get("ctx_total")
            row.update(
                target_weights_mib=_num(t.get("model_mib")),
                drafter_weights_mib=_num(d.get("model_mib")) if d else 0.0,
                target_kv_mib=_num(t.get("kv_mib")),
                draft_kv_mib=_num(d.get("kv_mib")) if d else 0.0,
                target_kv_kib_per_token=kv_kib_per_token(t.get("kv_mib"), ctx),
                draft_kv_kib_per_token=kv_kib_per_token(d.get("kv_mib"), ctx) if d else 0.0,
                compute_mib=(_num(t.get("compute_mib")) or 0.0) + (_num(d.get("compute_mib")) or 0.0),
                draft_compute_mib=_num(d.get("compute_mib")) if d else 0.0,
                recurrent_mib=(_num(t.get("recurrent_mib")) or 0.0) + (_num(d.get("recurrent_mib")) or 0.0),
                recurrent_cells=t.get("recurrent_cells"),
                slots=cap.get("slots"),
                ctx_total=cap.get("ctx_total"),
                ctx_per_slot=cap.get("ctx_per_slot"),
            )
            sv = servable_context(cap, budget)
            fixed = sum(row[k] or 0.0 for k in ("target_weights_mib", "drafter_weights_mib", "compute_mib", "recurrent_mib"))
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
            df.loc[sel, "servable_ctx_vs_baseline"] = df.loc[sel, "servable_ctx_total"].astype("float64") / b if b else None
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
    samples = [g for g in ph.loc[ph["config"] == name, "gpu"] if isinstance(g, dict)] if not ph.empty and "gpu" in ph else []
    seen = [g for g in samples if g.get("available") and isnum(g.get("used_bytes"))]
    engine = [float(g["process_bytes"]) for g in seen if isnum(g.get("process_bytes"))]
    peak = lambda vals: max(vals) / MIB if vals else None  # noqa: E731
    if not samples:
        note: str | None = "no GPU sample recorded"
    elif not seen:
        note = str(next((g.get("why") for g in samples if g.get("why")), "GPU unavailable"))
    elif not engine:
        note = "engine: " + str(next((g.get("process_why") for g in seen if g.get("process_why")), "not reported"))
    else:
        note = None
    return {"gpu_used_mib": peak([float(g["used_bytes"]) for g in seen]),
            "gpu_total_mib": peak([float(g["total_bytes"]) for g in seen if isnum(g.get("total_bytes"))]),
            "engine_gpu_mib": peak(engine), "gpu_phases": len(seen), "gpu_note": note}


# ---- max streams under the SLO ----------------------------------------------------------------
def max_streams_table(runs: list[RunData], slo_override: dict[str, float] | None = None) -> pd.DataFrame:
    """The largest N meeting the SLO: from the run's adaptive ramp (ramp.jsonl) where it has one and the
    SLO is the one the ramp used, else the largest measured N at which it and every smaller one passed."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        slo = dict(slo_override or run.scenario.get("slo") or {})
        tps_min = _num(slo.get("per_stream_tps_min"))
        ttft_max = _num(slo.get("ttft_p95_s_max"))
        rq = run.requests
        ramp_steps: dict[str, list[dict[str, Any]]] = {}
        for rec in run.ramp:
            if rec.get("event") == "step":
                ramp_steps.setdefault(rec["config"], []).append(rec)
        for name in run.config_names:
            meta = run.manifest.get("configurations", {}).get(name, {})
            cap = run.capacity.get(name, {})
            steps = _ramp_steps(rq, name, ramp_steps.get(name, []))
            source = "adaptive ramp" if steps else "measured stream counts"
            if not steps:
                r = rq[(rq["config"] == name) & (rq["phase"] == "measure")] if not rq.empty else rq
                steps = [(int(n), r[r["streams"] == n]) for n in sorted(int(n) for n in r["streams"].unique())] if not r.empty else []
            best, broke, at_best, evidence, passed_any_above = _max_streams_of(steps, tps_min, ttft_max, ramped=source == "adaptive ramp")
            tried = [n for n, _ in steps]
            ramp_max = ((run.scenario.get("slo") or {}).get("ramp") or {}).get("max_streams")
            rows.append({
                "run": run.run_id, "config": name, "algorithm": meta.get("algorithm"), "synthetic": bool(meta.get("synthetic")),
                "slo_per_stream_tps_min": tps_min, "slo_ttft_p95_s_max": ttft_max,
                "slo_source": "override" if slo_override else ("scenario" if (tps_min or ttft_max) else "none: no failed request"),
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
            })
    return pd.DataFrame(rows)


def _ramp_steps(rq: pd.DataFrame, name: str, steps: list[dict[str, Any]]) -> list[tuple[int, pd.DataFrame]]:
    """The ramp's stream counts in the order tried, each with its requests (phase 'ramp')."""
    if not steps or rq.empty or "attempt" not in rq:
        return []
    r = rq[(rq["config"] == name) & (rq["phase"] == "ramp")]
    return [(int(s["streams"]), r[r["attempt"] == s["attempt"]]) for s in steps]


def _max_streams_of(steps: list[tuple[int, pd.DataFrame]], tps_min: float | None, ttft_max: float | None,
                    ramped: bool) -> tuple[int | None, str, dict[str, Any], str, list[str]]:
    """Measured counts: walk up, stop at the first failure. A ramp (doubling, then bisection): the
    largest N that passed below the smallest N that failed; an N that passed above it is named."""
    best: int | None = 0 if steps else None
    evidence: list[str] = []
    verdicts: dict[int, Any] = {}
    for n, rn in steps:
        v = slo_verdict(zip(rn["status"], rn.get("decode_tps", [None] * len(rn)), rn.get("ttft_s", [None] * len(rn))), tps_min, ttft_max)
        verdicts[n] = v
        evidence.append(v.evidence(n))
        if not ramped and not v.passed:
            break
    failing = sorted(n for n, v in verdicts.items() if not v.passed)
    first_fail = failing[0] if failing else None
    passing = sorted(n for n, v in verdicts.items() if v.passed and (first_fail is None or n < first_fail))
    if passing:
        best = passing[-1]
    above = [f"N={n} passed" for n, v in sorted(verdicts.items()) if v.passed and first_fail is not None and n > first_fail]
    broke = f"N={first_fail}: {verdicts[first_fail].why}" if first_fail is not None else ""
    at_best = {"per_stream_tps": verdicts[best].per_stream_tps, "ttft_p95_s": verdicts[best].ttft_p95_s} if best else {}
    return best, broke, at_best, "; ".join(evidence), above


# ---- soak ------------------------------------------------------------------------------------
def soak_table(runs: list[RunData]) -> pd.DataFrame:
    """Per soaked configuration: how long, how many requests, what failed and when, what drifted."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        slices = run.soak_slices
        if not slices and run.soak_requests.empty:
            continue
        starts = {e["slice"]: e for e in slices if e.get("event") == "start"}
        ends = {e["slice"]: e for e in slices if e.get("event") == "end"}
        sr = run.soak_requests
        configs = sorted({e["config"] for e in slices} | (set(sr["config"].unique()) if not sr.empty else set()))
        for name in configs:
            # each slice's soak time: its recorded elapsed time, or (cut short) up to its last record
            order = sorted((s for s in starts.values() if s["config"] == name), key=lambda s: (s["t_unix"], s["slice"]))
            offsets: dict[str, tuple[float, float]] = {}  # slice -> (soak seconds before it, its start)
            total = 0.0
            recs = sr[sr["config"] == name] if not sr.empty else sr
            for s in order:
                offsets[s["slice"]] = (total, float(s["t_unix"]))
                if s["slice"] in ends:
                    total += float(ends[s["slice"]]["elapsed_s"])
                else:
                    mine = recs[recs["attempt"] == s["slice"]] if not recs.empty and "attempt" in recs else recs.iloc[0:0]
                    last = max((float(a) + float(b or 0)) for a, b in zip(mine["start_unix_s"], mine["e2e_s"])) if not mine.empty else s["t_unix"]
                    total += max(0.0, last - float(s["t_unix"]))
            kinds: Counter[str] = Counter()
            fail_times: list[float] = []
            if not recs.empty:
                bad = recs[recs["status"] != "ok"]
                kinds.update(str(k) for k in bad["error_kind"].fillna("unknown"))
                fail_times += [_soak_time(offsets, sl, float(t)) for sl, t in zip(bad.get("attempt", [""] * len(bad)), bad["start_unix_s"])]
            verdicts = [v for v in run.soak_verdicts if v.get("config") == name]
            for v in verdicts:
                if v.get("kind") in WATCHDOG_FAILURES:
                    kinds[f"engine {v['kind']}"] += 1
                    fail_times.append(_soak_time(offsets, v.get("slice", ""), float(v["t_unix"])))
            failures = sum(kinds.values())
            ftimes = [t for t in fail_times if t is not None]
            drift = [f"{v.get('metric')}: {v.get('message')}" for v in verdicts if v.get("kind") == "drift"]
            failing = [v for v in verdicts if verdict_fails(v)]
            first_up = next((float(v["engine_uptime_s"]) for v in failing if v.get("engine_uptime_s") is not None), None)
            episodes = collapse_episodes(verdicts)
            cw = [w for w in run.soak_windows if w.get("config") == name]
            rows.append({
                "run": run.run_id, "config": name, "slices": len(order), "duration_s": total,
                "requests": int(len(recs)), "requests_ok": int((recs["status"] == "ok").sum()) if not recs.empty else 0,
                "failures": failures, "failures_by_kind": json.dumps(dict(sorted(kinds.items())), ensure_ascii=False),
                "time_to_first_failure_s": min(ftimes) if ftimes else None,
                "failures_per_hour": failures / (total / 3600.0) if total > 0 else None,
                "error_rate_windows": sum(1 for v in verdicts if v.get("kind") == "error_rate"),
                "restarts": sum(int(e.get("restarts") or 0) for e in ends.values() if e.get("config") == name),
                "windows": sum(1 for w in run.soak_windows if w.get("config") == name),
                "drift_verdicts": len(drift),
                "drift": " | ".join(drift) if drift else "none",
                "soak_verdict": "failed" if failing else "ok",
                "first_failure_engine_uptime_h": first_up / 3600 if first_up is not None else None,
                "first_failure": f"{failing[0]['kind']}" + (f" of {failing[0]['metric']}" if failing and failing[0].get("metric") else "") if failing else "none",
                "collapse_episodes": " | ".join(episodes) if episodes else "none",
                "max_engine_uptime_h": max((float(w.get("engine_uptime_s") or 0) for w in cw), default=0.0) / 3600 if cw else None,
                "judged_windows": sum(1 for w in cw if w.get("judged")),
                "canary": canary_cell(run.canary, verdicts, name),
                **_soak_cpu([w for w in run.soak_windows if w.get("config") == name]),
                **_soak_rates(cw),
                **_soak_watch(cw, verdicts),
            })
    return pd.DataFrame(rows)


# the engine's own series a soak window records (docs/soak.md#engine-view): absent, never 0, where an engine lacks one
ENGINE_VIEW_LABELS = {"requests_running": "requests running", "requests_waiting": "requests waiting", "kv_usage": "KV usage",
                      "preemptions": "preemptions", "prefix_hit_rate": "prefix-cache hit rate", "prompt_cache_mib": "prompt cache size"}


def _soak_watch(windows: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Stalls, memory as operators meet it, the prompt cache, the work done and why the first explained verdict came."""
    worst, slope = stall_trend(windows)
    cache = [(w, float(w["prompt_cache_mib"])) for w in windows if isinstance(w.get("prompt_cache_mib"), int | float)]
    growth = "none"
    if cache:
        first, last = cache[0], cache[-1]
        cap = last[0].get("prompt_cache_cap_mib")
        warned = any(v.get("kind") == "cache_cap" for v in verdicts)
        cap_text = f" toward its cap of {cap:,.0f} MiB" if isinstance(cap, int | float) and cap >= 0 else " with no cap"
        growth = (f"cache growth {first[1]:,.0f} → {last[1]:,.0f} MiB{cap_text}, "
                  + ("a cap larger than the memory left (cache_cap verdict)" if warned else "by design: it fits in the memory left"))
    explained = next((v for v in verdicts if isinstance((v.get("evidence") or {}).get("explanation"), dict)), None)
    held = [max(float(w.get("engine_rss_mib") or 0.0), float(w.get("engine_anon_mib") or 0.0)) for w in windows]
    return {
        "longest_stall_s": worst,
        "stall_trend_s_per_h": slope,
        "stall_verdicts": sum(1 for v in verdicts if v.get("kind") == "stall"),
        "prompt_cache": growth,
        "peak_engine_memory_mib": max(held) if held else None,
        "peak_swap_mib": max((float(w["engine_swap_mib"]) for w in windows if isinstance(w.get("engine_swap_mib"), int | float)), default=None),
        "engine_requests_done": max((float(w["engine_requests_done"]) for w in windows if isinstance(w.get("engine_requests_done"), int | float)), default=None),
        "engine_output_tokens_done": max((float(w["engine_output_tokens_done"]) for w in windows
                                          if isinstance(w.get("engine_output_tokens_done"), int | float)), default=None),
        "not_reported": ", ".join(label for key, label in ENGINE_VIEW_LABELS.items() if windows and all(w.get(key) is None for w in windows)),
        "why": (f"{explained['kind']}" + (f" of {explained['metric']}" if explained.get("metric") else "")
                + f": {explained['evidence']['explanation'].get('text')}") if explained else "",
    }


def _soak_rates(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests per second over a configuration's soak windows (docs/soak.md#open-loop-arrivals): achieved and goodput
    pooled over the windows' seconds; open loop: offered (scheduled arrivals over the schedule's seconds), late sends."""
    secs = [(w, float(w["t_end_unix"]) - float(w["t_start_unix"])) for w in windows if w.get("t_end_unix") and w.get("t_start_unix")]
    total = sum(s for _, s in secs)

    def pooled(key: str) -> float | None:
        have = [(float(w[key]), s) for w, s in secs if w.get(key) is not None]
        return sum(v * s for v, s in have) / sum(s for _, s in have) if have and sum(s for _, s in have) > 0 else None

    spans = [(int(w.get("scheduled") or 0), float(w["soak_t_end_s"]) - float(w["soak_t_start_s"])) for w in windows
             if w.get("soak_t_end_s") is not None and w.get("soak_t_start_s") is not None]
    span = sum(s for _, s in spans)
    return {
        "achieved_rps": pooled("achieved_rps") if total > 0 else None,
        "goodput_rps": pooled("goodput_rps") if total > 0 else None,
        "offered_rps": sum(n for n, _ in spans) / span if span > 0 else None,
        "late": sum(int(w.get("late") or 0) for w in windows) if spans else None,
    }


def collapse_episodes(verdicts: list[dict[str, Any]]) -> list[str]:
    """Each collapse as 'metric: change from engine uptime A h to B h' (B missing when it did not recover)."""
    out: list[str] = []
    open_: dict[str, dict[str, Any]] = {}
    for v in sorted(verdicts, key=lambda v: float(v.get("t_unix") or 0)):
        metric = str(v.get("metric"))
        if v.get("kind") == "collapse":
            open_[metric] = v
        elif v.get("kind") == "recovered" and metric in open_:
            start = open_.pop(metric)
            ev = v.get("evidence") or {}
            out.append(f"{metric}: {_up(start)} to {_up(v)} (worst {float(ev.get('size') or 0):+.0%})")
    for metric, start in open_.items():
        change = (start.get("evidence") or {}).get("relative_change")
        out.append(f"{metric}: {float(change or 0):+.0%} from {_up(start)}, not recovered")
    return out


def _up(v: dict[str, Any]) -> str:
    up = v.get("engine_uptime_s")
    return f"{float(up) / 3600:.2f} h uptime" if up is not None else "?"


def after_soak_table(runs: list[RunData]) -> pd.DataFrame:
    """The measurement before the soak (fresh engine) and after it (the soaked engine), per configuration and
    stream count: total t/s, solo decode, acceptance, TTFT; 'worse' when the after figure is below the
    before's 95% interval (t interval over the repetitions)."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        after = pd.DataFrame(run.after_soak)
        if after.empty or (run.phases.empty and run.arrival_phases.empty):
            continue
        rq = run.requests
        # an open-loop phase is keyed by its load (a rate, or 'stages'): its streams is max_in_flight, the same for all
        after["key"] = [ld if isinstance(ld, str) else int(n) for ld, n in zip(after.get("load", [None] * len(after)), after["streams"])]
        for (name, key), grp in after.groupby(["config", "key"], sort=True):
            open_loop = isinstance(key, str)
            pool = run.arrival_phases if open_loop else run.phases
            if pool.empty:
                continue
            before = pool[(pool["config"] == name) & (pool["load" if open_loop else "streams"] == key)]
            if before.empty:
                continue
            n = int(grp["streams"].iloc[0])
            b_tps, a_tps = [float(x) for x in before["total_tps"]], [float(x) for x in grp["total_tps"]]
            lo, hi = t_interval(b_tps)
            b_med, a_med = float(pd.Series(b_tps).median()), float(pd.Series(a_tps).median())
            row: dict[str, Any] = {"run": run.run_id, "config": name, "streams": int(n), "before_total_tps": b_med, "after_total_tps": a_med,
                                   "after_vs_before": a_med / b_med if b_med else None, "before_ci_low": lo, "before_ci_high": hi,
                                   "before_reps": len(b_tps), "after_reps": len(a_tps),
                                   "engine_uptime_h": float(grp["engine_uptime_s"].max()) / 3600 if "engine_uptime_s" in grp else None}
            if open_loop:  # what the same schedule got, before and after
                row["load"] = key
                for label, ph in (("before", before), ("after", grp)):
                    for col in ("achieved_rps", "goodput_rps", "late"):
                        vals = [float(x) for x in ph[col].dropna()] if col in ph else []
                        row[f"{label}_{col}"] = float(pd.Series(vals).median()) if vals else None
            for label, ph in (("before", before), ("after", grp)):
                acc = _pooled_acceptance(ph)
                row[f"{label}_acceptance"] = acc
                if not rq.empty:
                    r = rq[rq["attempt"].isin(set(ph["attempt"])) & (rq["status"] == "ok")]
                    row[f"{label}_decode_tps"] = float(r["decode_tps"].median()) if not r.empty else None
                    row[f"{label}_ttft_p50_s"] = float(r["ttft_s"].median()) if not r.empty else None
            if lo is not None and hi is not None:
                row["verdict"] = "worse" if a_med < lo else ("better" if a_med > hi else "same within the interval")
            else:
                row["verdict"] = "n/a (one repetition: no interval)"
            rows.append(row)
    return pd.DataFrame(rows)


def _pooled_acceptance(ph: pd.DataFrame) -> float | None:
    drafted = sum(float((c or {}).get("draft_tokens") or 0) for c in ph.get("counters", []))
    accepted = sum(float((c or {}).get("accepted_tokens") or 0) for c in ph.get("counters", []))
    return acceptance_figures(EngineCounters(draft_tokens=drafted, accepted_tokens=accepted))["acceptance"]


def _soak_cpu(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median engine and harness (incl. Locust) cores over the soak's windows, and windows contaminated by others."""
    cpu = [w["cpu"] for w in windows if isinstance(w.get("cpu"), dict)]
    med = lambda key: float(pd.Series([c[key] for c in cpu]).median()) if cpu else None  # noqa: E731
    return {"engine_cores": med("engine_cores"), "harness_cores": med("harness_cores"), "other_cores": med("other_cores"),
            "contaminated_windows": sum(1 for w in windows if w.get("contaminated")) if cpu else None}


def _soak_time(offsets: dict[str, tuple[float, float]], slice_id: str, t_unix: float) -> float | None:
    """Soak seconds of this configuration before ``t_unix`` (slices of other configurations excluded)."""
    if slice_id in offsets:
        before, start = offsets[slice_id]
        return before + max(0.0, t_unix - start)
    return None


# ---- break-even concurrency -------------------------------------------------------------------
def _solo_vs_n1(solo: Any, n1: Any) -> str:
    """Why the verdict's solo ratio and this table's ratio at 1 stream can tell different stories ('' when they agree)."""
    if not (isnum(solo) and isnum(n1)) or ((solo > 1.0) == (n1 > 1.0) and abs(float(solo) / float(n1) - 1.0) < 0.1):
        return ""
    return (f"solo decode {float(solo):.2f}× counts the decode rate after the first token; total t/s at N=1 {float(n1):.2f}× "
            f"also counts prompt processing and the first token, which speculation does not speed up")



def breakeven_table(verdict: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for _, v in verdict.iterrows():
        if v["algorithm"] in (None, "none") or v.get("status") != "done":
            continue
        pts = [(n, float(v[f"speedup_{n}"])) for n in counts if isnum(v.get(f"speedup_{n}"))]
        be = break_even(pts)
        ev = be["evidence"]
        if be["kind"] == "crosses":
            (n1, s1), (n2, s2) = ev  # type: ignore[misc]
            text = f"{be['streams']:.1f} streams (N={n1}: {s1:.2f}×, N={n2}: {s2:.2f}×)"
        elif be["kind"] == "never":
            text = f"never within measured N (still {ev[0][1]:.2f}× at N={ev[0][0]})"  # type: ignore[index]
        elif be["kind"] == "always":
            text = f"always: no gain even at N={ev[0][0]} ({ev[0][1]:.2f}×)"  # type: ignore[index]
        elif be["kind"] == "mixed":
            text = "mixed: " + ", ".join(f"N={n}: {s:.2f}×" for n, s in ev)  # type: ignore[misc]
        else:
            text = "no measured speedup"
        # what the intervals show at each N: a point above 1.0 whose interval straddles it is no win
        shown = [f"N={n}: {shown_difference(v.get(f'speedup_{n}_ci_low'), v.get(f'speedup_{n}_ci_high')) or 'no interval'}"
                 for n in counts if isnum(v.get(f"speedup_{n}"))]
        rows.append({"run": v["run"], "config": v["config"], "algorithm": v["algorithm"], "synthetic": bool(v["synthetic"]),
                     "shown_by_intervals": ", ".join(shown), "solo_vs_n1": _solo_vs_n1(v.get("solo_speedup"), v.get("speedup_1")),
                     "break_even_kind": be["kind"], "break_even_streams": be["streams"],
                     "evidence": json.dumps([[int(n), round(float(s), 6)] for n, s in ev]), "break_even": text})  # type: ignore[misc]
    return pd.DataFrame(rows)


# ---- explanation: acceptance model and roofline -------------------------------------------------
def _solo_decode(run: RunData, name: str) -> tuple[float, float, dict[int, dict[str, Any]]]:
    """(decode seconds, tokens after the first) of the 1-stream measured requests, and their phases by repetition."""
    rq = run.requests
    r = rq[(rq["config"] == name) & (rq["phase"] == "measure") & (rq["streams"] == 1) & (rq["status"] == "ok")] if not rq.empty else rq
    secs = toks = 0.0
    for out, tps in zip(r.get("output_tokens", []), r.get("decode_tps", [])):
        if isnum(out) and isnum(tps) and tps > 0 and out > 1:
            secs += (out - 1) / tps
            toks += out - 1
    ph = run.phases
    p = ph[(ph["config"] == name) & (ph["streams"] == 1)] if not ph.empty else ph
    by_rep = {int(rep): c for rep, c in zip(p.get("repetition", []), p.get("counters", []))}
    return secs, toks, by_rep


def explain_table(runs: list[RunData], verdict: pd.DataFrame) -> pd.DataFrame:
    """Predicted solo speedup from α, K and the measured cost of a step, beside the measured one."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        first_base = next((n for n in run.config_names if run.manifest["configurations"][n].get("algorithm") == "none"
                           and run.manifest["configurations"][n].get("status") == "done"), None)
        if first_base is None:
            continue
        for name in run.config_names:
            meta = run.manifest["configurations"][name]
            if meta.get("algorithm") in (None, "none") or meta.get("status") != "done":
                continue
            vb = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            if "baseline" not in vb or vb.empty or not isinstance(vb["baseline"].iloc[0], str):
                continue  # no baseline serves its target model: nothing to explain against
            base = vb["baseline"].iloc[0]
            b_secs, b_toks, _ = _solo_decode(run, base)
            t_base = b_secs / b_toks if b_toks else None
            secs, toks, by_rep = _solo_decode(run, name)
            steps = sum(float(c.get("verify_steps") or 0) for c in by_rep.values())
            drafted = sum(float(c.get("draft_tokens") or 0) for c in by_rep.values())
            accepted = sum(float(c.get("accepted_tokens") or 0) for c in by_rep.values())
            alpha = accepted / drafted if drafted else None
            mean_len = 1 + accepted / steps if steps else None
            k, k_source = _k_of(run, name, drafted, steps)
            plain = max(0.0, toks - steps - accepted)  # decode steps that verified no draft: one token each
            row: dict[str, Any] = {"run": run.run_id, "config": name, "algorithm": meta.get("algorithm"),
                                   "synthetic": bool(meta.get("synthetic")), "acceptance": alpha, "k": k, "k_source": k_source,
                                   "verify_steps": steps, "plain_steps": plain, "mean_accept_len": mean_len}
            e_pred = expected_tokens_per_step(min(1.0, alpha), int(k)) if alpha is not None and k else None
            t_step = (secs - plain * t_base) / steps if steps and t_base else None
            cost = t_step / t_base if t_step and t_base else None
            row["expected_tokens_per_step"] = e_pred
            row["baseline_ms_per_token"] = t_base * 1e3 if t_base else None
            row["step_ms"] = t_step * 1e3 if t_step else None
            row["step_cost_in_baseline_tokens"] = cost
            row["break_even_acceptance"] = break_even_acceptance(cost, int(k)) if cost and k else None
            if cost and e_pred is not None:
                row["predicted_solo_speedup"] = (steps * e_pred + plain) / (steps * cost + plain)
            else:
                row["predicted_solo_speedup"] = None
            if cost and mean_len is not None:
                row["modelled_solo_speedup_at_measured_length"] = (steps * mean_len + plain) / (steps * cost + plain)
            else:
                row["modelled_solo_speedup_at_measured_length"] = None
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            row["measured_solo_speedup"] = _num(v["solo_speedup"].iloc[0]) if not v.empty else None
            rows.append(row)
    return pd.DataFrame(rows)


def break_even_acceptance(cost: float, k: int) -> float | None:
    """The acceptance α at which (1 − α^(K+1)) / (1 − α) equals the step cost ``cost`` (in baseline
    tokens): below it the drafter loses. None when even α = 1 (K+1 tokens a step) cannot pay for it."""
    if cost <= 1.0:
        return 0.0
    if cost >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < cost:
            lo = mid
        else:
            hi = mid
    return hi


def _k_of(run: RunData, name: str, drafted: float, steps: float) -> tuple[int | None, str]:
    k = _cfg_meta(run, name).get("k")
    if k:
        return int(k), "scenario"
    n_max = (run.capacity.get(name) or {}).get("spec_n_max")
    if n_max:
        return int(n_max), "start-up log n_max"
    if steps:
        return max(1, round(drafted / steps)), "drafted / steps (effective)"
    return None, "unknown"


def roofline_table(runs: list[RunData], verdict: pd.DataFrame) -> pd.DataFrame:
    """The baseline's solo decode t/s against bandwidth / bytes per token (the model file, read once per token)."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        bw = (run.manifest.get("machine") or {}).get("memory_bandwidth") or {}
        gbs = _num(bw.get("gb_per_s"))
        for name in run.config_names:
            if run.manifest["configurations"][name].get("algorithm") != "none":
                continue
            cap = run.capacity.get(name, {})
            mib = _num(cap.get("model_file_mib")) or _num((cap.get("target") or {}).get("model_mib"))
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            solo = _num(v["solo_decode_tps"].iloc[0]) if not v.empty else None
            roof = gbs * 1e9 / (mib * 2**20) if gbs and mib else None
            rows.append({"run": run.run_id, "config": name, "bandwidth_gb_per_s": gbs,
                         "bandwidth_method": bw.get("method") or "not measured (run made before the measurement existed)",
                         "bytes_per_token_mib": mib, "roofline_tps": roof, "solo_decode_tps": solo,
                         "roofline_pct": 100.0 * solo / roof if solo and roof else None})
    return pd.DataFrame(rows)


# ---- losslessness ---------------------------------------------------------------------------------
def verify_table(runs: list[RunData]) -> pd.DataFrame:
    """One row per (configuration, streams) of `specsoak verify`: identical prompts, first divergences."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
        for r in run.verify:
            groups.setdefault((r["config"], int(r["streams"]), r.get("reference", "")), []).append(r)
        for (cfg, n, ref), recs in sorted(groups.items()):
            recs = sorted(recs, key=lambda r: str(r.get("prompt_id")))
            same = sum(1 for r in recs if r.get("identical"))
            div = [r for r in recs if r.get("identical") is False]
            err = [r for r in recs if r.get("identical") is None]
            first = min((int(r["first_diff_token"]) for r in div if r.get("first_diff_token") is not None), default=None)
            rows.append({
                "run": run.run_id, "config": cfg, "algorithm": recs[0].get("algorithm"), "synthetic": bool(recs[0].get("synthetic")),
                "streams": n, "reference": ref, "method": recs[0].get("method"), "prompts": len(recs), "identical": same,
                "diverged": len(div), "errors": len(err), "earliest_divergence_token": first,
                "drafted_tokens": sum(int(r.get("draft_tokens") or 0) for r in recs),
                "divergences": "; ".join(f"{r['prompt_id']}@{r.get('first_diff_token')}" for r in div) or "none",
                "verdict": _verify_verdict(recs, same, div, err),
            })
    return pd.DataFrame(rows)


def _verify_verdict(recs: list[dict[str, Any]], same: int, div: list[Any], err: list[Any]) -> str:
    if recs[0].get("synthetic"):
        return "synthetic: never lossless"
    if err:
        return f"incomplete ({len(err)} failed)"
    if div:
        return f"diverged on {len(div)} of {len(recs)} prompts"
    return f"identical on all {same} prompts"


def verify_distribution_table(runs: list[RunData]) -> pd.DataFrame:
    rows = [dict(run_id=run.run_id, **{k: v for k, v in r.items() if k != "counts"}) for run in runs for r in run.verify_dist]
    df = pd.DataFrame(rows)
    return df.rename(columns={"run_id": "run"}) if not df.empty else df


# ---- K sweep ----------------------------------------------------------------------------------
def k_sweep_table(runs: list[RunData], verdict: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
    """One row per swept configuration (grouped by the configuration it was expanded from), with
    acceptance, mean length and t/s against K, and ``best_for``: the columns (solo, @N) at which
    this K gave the highest throughput within its group."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for name, meta in (run.manifest.get("configurations") or {}).items():
            group = meta.get("sweep_of")
            if not group:
                continue
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            if v.empty:
                continue
            spec = _cfg_meta(run, name)
            syn = (spec.get("synthetic") or {}).get("length")
            row: dict[str, Any] = {
                "run": run.run_id, "sweep": group, "config": name, "algorithm": meta.get("algorithm"),
                "k": meta.get("k"), "synthetic_length": syn,
                "acceptance": _num(v["acceptance"].iloc[0]), "mean_accept_len": _num(v["mean_accept_len"].iloc[0]),
                "solo_decode_tps": _num(v["solo_decode_tps"].iloc[0]),
            }
            for n in counts:
                row[f"total_tps_{n}"] = _num(v[f"total_tps_{n}"].iloc[0]) if f"total_tps_{n}" in v else None
            rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    best: dict[int, list[str]] = {i: [] for i in df.index}
    # best K per column, within each (run, sweep, synthetic length) group: synthetic lengths are separate experiments
    for _, grp in df.groupby(["run", "sweep", df["synthetic_length"].fillna(-1)], sort=True):
        for col, label in [("solo_decode_tps", "solo")] + [(f"total_tps_{n}", f"@{n}") for n in counts]:
            vals = grp[col].dropna() if col in grp else pd.Series(dtype=float)
            if len(vals) >= 2:
                best[int(vals.idxmax())].append(label)
    df["best_for"] = [", ".join(best[i]) for i in df.index]
    return df.sort_values(["run", "sweep", "synthetic_length", "k"], na_position="first").reset_index(drop=True)


def prompts_table(runs: list[RunData]) -> pd.DataFrame:
    """How many different prompts each measured phase and each configuration's soak sent (docs/metrics.md#prompts):
    a prompt is a (prompt id, turn) pair, so a conversation's later turns count apart; ``repeated`` is requests
    that sent a prompt already sent in the same phase (or soak)."""
    from harness.records.files import SOAK_DIR
    from harness.records.columnar import soak_requests_frame

    rows: list[dict[str, Any]] = []
    for run in runs:
        phases = [df for df in (run.phases, run.arrival_phases) if not df.empty and "distinct_prompts" in df]
        after = [p for p in run.after_soak if p.get("distinct_prompts") is not None]
        for p in [r for df in phases for r in df.to_dict("records")] + after:
            if not isnum(p.get("distinct_prompts")):
                continue
            load = p.get("load") if isinstance(p.get("load"), str) else p.get("streams")
            rows.append({"run": run.run_id, "config": p["config"], "phase": p.get("phase"), "load": str(load),
                         "repetition": p.get("repetition"), "requests": int(p["requests"]), "distinct_prompts": int(p["distinct_prompts"]),
                         "repeated": int(p["requests"]) - int(p["distinct_prompts"])})
        try:
            sr = soak_requests_frame(run.run_dir / SOAK_DIR, ["config", "prompt_id", "turn", "start_unix_s", "id"])
        except (OSError, ValueError, KeyError):  # records the report cannot read that way: no soak row
            sr = pd.DataFrame()
        if not sr.empty:
            sr = sr[sr["prompt_id"].notna()]  # records without a prompt id say nothing here
        for name, g in (sr.groupby("config", sort=True) if not sr.empty else []):
            distinct = int(len(g[["prompt_id", "turn"]].fillna(0).drop_duplicates()))
            rows.append({"run": run.run_id, "config": name, "phase": "soak", "load": "", "repetition": None, "requests": int(len(g)),
                         "distinct_prompts": distinct, "repeated": int(len(g)) - distinct})
    return pd.DataFrame(rows)
