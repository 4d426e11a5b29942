"""The soak tables: failures, watchdog verdicts and rates per soaked configuration, and the phases after the soak."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pandas as pd

from engines.types import EngineCounters, acceptance_figures
from harness.common.stats import UNPAIRED_MIN_PER_SIDE, t_interval, unpaired_ratio_interval
from harness.config.policy import ENGINE_FAILURES, verdict_fails
from harness.report.load import RunData
from harness.soak.canary import canary_cell
from harness.soak.coverage import coverage
from harness.soak.figures import stall_trend
from harness.soak.watchdog import overload_cell

WATCHDOG_FAILURES = (
    *ENGINE_FAILURES,
    "collapse",
    "memory",
)  # the verdicts the soak table counts as failures ("engine KIND")


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
                    mine = (
                        recs[recs["attempt"] == s["slice"]] if not recs.empty and "attempt" in recs else recs.iloc[0:0]
                    )
                    last = (
                        max(
                            (float(a) + float(b or 0)) for a, b in zip(mine["start_unix_s"], mine["e2e_s"], strict=True)
                        )
                        if not mine.empty
                        else s["t_unix"]
                    )
                    total += max(0.0, last - float(s["t_unix"]))
            kinds: Counter[str] = Counter()
            fail_times: list[float | None] = []
            if not recs.empty:
                bad = recs[recs["status"] != "ok"]
                kinds.update(str(k) for k in bad["error_kind"].fillna("unknown"))
                fail_times += [
                    _soak_time(offsets, sl, float(t))
                    for sl, t in zip(bad.get("attempt", [""] * len(bad)), bad["start_unix_s"], strict=True)
                ]
            verdicts = [v for v in run.soak_verdicts if v.get("config") == name]
            for v in verdicts:
                if v.get("kind") in WATCHDOG_FAILURES:
                    kinds[f"engine {v['kind']}"] += 1
                    fail_times.append(_soak_time(offsets, v.get("slice", ""), float(v["t_unix"])))
            failures = sum(kinds.values())
            ftimes = [t for t in fail_times if t is not None]
            drift = [f"{v.get('metric')}: {v.get('message')}" for v in verdicts if v.get("kind") == "drift"]
            overloads = [overload_cell(v) for v in verdicts if v.get("kind") == "overload"]
            failing = [v for v in verdicts if verdict_fails(v)]
            first_up = next(
                (float(v["engine_uptime_s"]) for v in failing if v.get("engine_uptime_s") is not None), None
            )
            episodes = collapse_episodes(verdicts)
            cw = [w for w in run.soak_windows if w.get("config") == name]
            cov = coverage(cw)
            rows.append(
                {
                    "run": run.run_id,
                    "config": name,
                    "slices": len(order),
                    "duration_s": total,
                    "requests": len(recs),
                    "requests_ok": int((recs["status"] == "ok").sum()) if not recs.empty else 0,
                    "failures": failures,
                    "failures_by_kind": json.dumps(dict(sorted(kinds.items())), ensure_ascii=False),
                    "time_to_first_failure_s": min(ftimes) if ftimes else None,
                    "failures_per_hour": failures / (total / 3600.0) if total > 0 else None,
                    "error_rate_windows": sum(1 for v in verdicts if v.get("kind") == "error_rate"),
                    "restarts": sum(int(e.get("restarts") or 0) for e in ends.values() if e.get("config") == name),
                    "windows": sum(1 for w in run.soak_windows if w.get("config") == name),
                    "drift_verdicts": len(drift),
                    "drift": " | ".join(drift) if drift else "none",
                    "overload": " | ".join(overloads) if overloads else "none",
                    "soak_verdict": "failed" if failing else "ok",
                    "first_failure_engine_uptime_h": first_up / 3600 if first_up is not None else None,
                    "first_failure": f"{failing[0]['kind']}"
                    + (f" of {failing[0]['metric']}" if failing and failing[0].get("metric") else "")
                    if failing
                    else "none",
                    "collapse_episodes": " | ".join(episodes) if episodes else "none",
                    "max_engine_uptime_h": max((float(w.get("engine_uptime_s") or 0) for w in cw), default=0.0) / 3600
                    if cw
                    else None,
                    "judged_windows": sum(1 for w in cw if w.get("judged")),
                    "judged_share": cov.share,
                    "coverage": cov.cell(),
                    "not_judged": cov.why(),
                    "coverage_detail": cov.sentence(name),
                    "canary": canary_cell(run.canary, verdicts, name),
                    **_soak_cpu([w for w in run.soak_windows if w.get("config") == name]),
                    **_soak_rates(cw),
                    **_soak_watch(cw, verdicts),
                }
            )
    return pd.DataFrame(rows)


# the engine's own series a soak window records (docs/soak.md#engine-view): absent, never 0, where an engine lacks one
ENGINE_VIEW_LABELS = {
    "requests_running": "requests running",
    "requests_waiting": "requests waiting",
    "kv_usage": "KV usage",
    "preemptions": "preemptions",
    "prefix_hit_rate": "prefix-cache hit rate",
    "prompt_cache_mib": "prompt cache size",
}


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
        growth = f"cache growth {first[1]:,.0f} → {last[1]:,.0f} MiB{cap_text}, " + (
            "a cap larger than the memory left (cache_cap verdict)"
            if warned
            else "by design: it fits in the memory left"
        )
    explained = next((v for v in verdicts if isinstance((v.get("evidence") or {}).get("explanation"), dict)), None)
    held = [max(float(w.get("engine_rss_mib") or 0.0), float(w.get("engine_anon_mib") or 0.0)) for w in windows]
    return {
        "longest_stall_s": worst,
        "stall_trend_s_per_h": slope,
        "stall_verdicts": sum(1 for v in verdicts if v.get("kind") == "stall"),
        "prompt_cache": growth,
        "peak_engine_memory_mib": max(held) if held else None,
        "peak_swap_mib": max(
            (float(w["engine_swap_mib"]) for w in windows if isinstance(w.get("engine_swap_mib"), int | float)),
            default=None,
        ),
        "engine_requests_done": max(
            (
                float(w["engine_requests_done"])
                for w in windows
                if isinstance(w.get("engine_requests_done"), int | float)
            ),
            default=None,
        ),
        "engine_output_tokens_done": max(
            (
                float(w["engine_output_tokens_done"])
                for w in windows
                if isinstance(w.get("engine_output_tokens_done"), int | float)
            ),
            default=None,
        ),
        "not_reported": ", ".join(
            label for key, label in ENGINE_VIEW_LABELS.items() if windows and all(w.get(key) is None for w in windows)
        ),
        "why": (
            f"{explained['kind']}"
            + (f" of {explained['metric']}" if explained.get("metric") else "")
            + f": {explained['evidence']['explanation'].get('text')}"
        )
        if explained
        else "",
    }


def _soak_rates(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests per second over a configuration's soak windows (docs/soak.md#open-loop-arrivals): achieved and goodput
    pooled over the windows' seconds; open loop: offered (scheduled arrivals over the schedule's seconds), late sends."""
    secs = [
        (w, float(w["t_end_unix"]) - float(w["t_start_unix"]))
        for w in windows
        if w.get("t_end_unix") and w.get("t_start_unix")
    ]
    total = sum(s for _, s in secs)

    def pooled(key: str) -> float | None:
        have = [(float(w[key]), s) for w, s in secs if w.get(key) is not None]
        return sum(v * s for v, s in have) / sum(s for _, s in have) if have and sum(s for _, s in have) > 0 else None

    spans = [
        (int(w.get("scheduled") or 0), float(w["soak_t_end_s"]) - float(w["soak_t_start_s"]))
        for w in windows
        if w.get("soak_t_end_s") is not None and w.get("soak_t_start_s") is not None
    ]
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
            out.append(
                f"{metric}: {_uptime_text(start)} to {_uptime_text(v)} (worst {float(ev.get('size') or 0):+.0%})"
            )
    for metric, start in open_.items():
        change = (start.get("evidence") or {}).get("relative_change")
        out.append(f"{metric}: {float(change or 0):+.0%} from {_uptime_text(start)}, not recovered")
    return out


def _uptime_text(v: dict[str, Any]) -> str:
    up = v.get("engine_uptime_s")
    return f"{float(up) / 3600:.2f} h uptime" if up is not None else "?"


def after_soak_table(runs: list[RunData]) -> pd.DataFrame:
    """The measurement before the soak (fresh engine) and after it (the soaked engine), per configuration and
    stream count: total t/s, solo decode, acceptance, TTFT, and the ratio after / before with its 95% interval
    (Welch's two-sample t interval of the phases' log median decode t/s, or log total t/s in open loop,
    soak.after_repetitions after against measurement.repetitions before; two or more on each side):
    'degraded' when the interval lies under 1, 'better' when it lies over 1."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        after = pd.DataFrame(run.after_soak)
        if after.empty or (run.phases.empty and run.arrival_phases.empty):
            continue
        rq = run.requests
        # an open-loop phase is keyed by its load (a rate, or 'stages'): its streams is max_in_flight, the same for all
        after["key"] = [
            ld if isinstance(ld, str) else int(n)
            for ld, n in zip(after.get("load", [None] * len(after)), after["streams"], strict=True)
        ]
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
            # judged on the phases' median decode t/s where every phase has one (closed loop): a request that failed
            # (a prompt longer than its slot, before and after alike) then does not halve its phase's figure
            metric = "median_decode_tps" if not open_loop and _every(before, grp, "median_decode_tps") else "total_tps"
            ratio, r_lo, r_hi = unpaired_ratio_interval(
                [float(x) for x in before[metric]], [float(x) for x in grp[metric]]
            )
            b_med, a_med = float(pd.Series(b_tps).median()), float(pd.Series(a_tps).median())
            row: dict[str, Any] = {
                "run": run.run_id,
                "config": name,
                "streams": int(n),
                "before_total_tps": b_med,
                "after_total_tps": a_med,
                "after_vs_before": a_med / b_med if b_med else None,
                "ratio_metric": metric,
                "ratio": ratio,  # of the geometric means, the centre of its interval
                "ratio_ci_low": r_lo,
                "ratio_ci_high": r_hi,
                "before_ci_low": lo,
                "before_ci_high": hi,
                "before_reps": len(b_tps),
                "after_reps": len(a_tps),
                "engine_uptime_h": float(grp["engine_uptime_s"].max()) / 3600 if "engine_uptime_s" in grp else None,
            }
            if open_loop:  # what the same schedule got, before and after
                row["load"] = key
                for label, ph in (("before", before), ("after", grp)):
                    for col in ("achieved_rps", "goodput_rps", "late"):
                        vals = [float(x) for x in ph[col].dropna()] if col in ph else []
                        row[f"{label}_{col}"] = float(pd.Series(vals).median()) if vals else None
            for label, ph in (("before", before), ("after", grp)):
                acc = _pooled_acceptance(ph)
                row[f"{label}_acceptance"] = acc
                # tokens drafted per answered request: a drafter that proposes more (or less) after the soak
                drafted = _counter_sum(ph, "draft_tokens")
                answered = float(ph["ok"].sum()) if "ok" in ph else 0.0
                row[f"{label}_drafted_per_request"] = drafted / answered if drafted and answered else None
                if not rq.empty:
                    r = rq[rq["attempt"].isin(set(ph["attempt"])) & (rq["status"] == "ok")]
                    row[f"{label}_decode_tps"] = float(r["decode_tps"].median()) if not r.empty else None
                    row[f"{label}_ttft_p50_s"] = float(r["ttft_s"].median()) if not r.empty else None
            if r_lo is not None and r_hi is not None:
                row["verdict"] = "degraded" if r_hi < 1.0 else ("better" if r_lo > 1.0 else "same within the interval")
            elif len(b_tps) < UNPAIRED_MIN_PER_SIDE and len(a_tps) < UNPAIRED_MIN_PER_SIDE:
                row["verdict"] = "n/a (one repetition each side: no interval)"
            elif len(b_tps) < UNPAIRED_MIN_PER_SIDE:  # a single value has no spread of its own
                row["verdict"] = "n/a (one repetition before (measurement.repetitions): no interval)"
            elif len(a_tps) < UNPAIRED_MIN_PER_SIDE:
                row["verdict"] = "n/a (one repetition after (soak.after_repetitions): no interval)"
            else:
                row["verdict"] = "n/a (no spread on either side: no interval)"
            rows.append(row)
    return pd.DataFrame(rows)


def _every(before: pd.DataFrame, after: pd.DataFrame, col: str) -> bool:
    """Every phase on both sides has a positive ``col``."""
    return all(col in ph and bool((pd.to_numeric(ph[col], errors="coerce") > 0).all()) for ph in (before, after))


def degraded_after_soak(after: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(run, config) -> what the verdict table's soak cell adds for a configuration slower after its soak than its
    fresh self beyond the interval: the worst such load, its ratio and interval."""
    out: dict[tuple[str, str], str] = {}
    if after.empty or "verdict" not in after:
        return out
    bad = after[after["verdict"] == "degraded"].sort_values("ratio")
    for (run, config), grp in bad.groupby(["run", "config"], sort=False):
        w = grp.iloc[0]
        load = w.get("load")
        where = (
            f"load {load}" if isinstance(load, str) else f"{int(w['streams'])} stream{'s' if w['streams'] > 1 else ''}"
        )
        out[(str(run), str(config))] = (
            f"degraded after soak: {w['ratio']:.2f}× [{w['ratio_ci_low']:.2f}, {w['ratio_ci_high']:.2f}] at {where}"
        )
    return out


def _counter_sum(ph: pd.DataFrame, key: str) -> float:
    """One engine counter's deltas summed over the phases ``ph`` (a missing counter counts 0)."""
    return sum(float((c or {}).get(key) or 0) for c in ph.get("counters", []))


def _pooled_acceptance(ph: pd.DataFrame) -> float | None:
    drafted, accepted = _counter_sum(ph, "draft_tokens"), _counter_sum(ph, "accepted_tokens")
    return acceptance_figures(EngineCounters(draft_tokens=drafted, accepted_tokens=accepted))["acceptance"]


def _soak_cpu(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median engine and harness (incl. Locust) cores over the soak's windows, and windows contaminated by others."""
    cpu = [w["cpu"] for w in windows if isinstance(w.get("cpu"), dict)]
    med = lambda key: float(pd.Series([c[key] for c in cpu]).median()) if cpu else None
    return {
        "engine_cores": med("engine_cores"),
        "harness_cores": med("harness_cores"),
        "other_cores": med("other_cores"),
        "contaminated_windows": sum(1 for w in windows if w.get("contaminated")) if cpu else None,
    }


def _soak_time(offsets: dict[str, tuple[float, float]], slice_id: str, t_unix: float) -> float | None:
    """Soak seconds of this configuration before ``t_unix`` (slices of other configurations excluded)."""
    if slice_id in offsets:
        before, start = offsets[slice_id]
        return before + max(0.0, t_unix - start)
    return None
