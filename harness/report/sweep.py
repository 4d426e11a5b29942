"""The request-rate sweep's tables, from open-loop phase records alone (harness/detect/saturation.py judges them).

``rate_sweep_table``: one row per (run, configuration, rate): offered, achieved, completions against the schedule,
late share, goodput, latency from the scheduled time, saturated or not and why, and against the baseline; judged on
the repetitions other processes did not contaminate where there are any (``judged_on``), else on all of them.
``saturation_table``: one row per (run, configuration): its saturation point, how it was decided, where speculation
stops paying in requests per second, and the break-even in streams beside it. Definitions: docs/metrics.md#rate-sweep.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd

from harness.common.stats import isnum, median, ratio_interval
from harness.detect.saturation import Judgement, PaysAt, Rule, judge_rate, pays_at, saturation_point, stops_paying
from harness.records.types import ConfigState
from harness.report.load import RunData


def _rule(run: RunData) -> Rule:
    arrival = (run.scenario.get("measurement") or {}).get("arrival") or {}
    return Rule.of(arrival.get("saturation") or {})


def _rate_phases(run: RunData) -> pd.DataFrame:
    """The run's open-loop phases at a single rate (not a stage list), with the rate as a column."""
    ap = run.arrival_phases
    if ap.empty or "arrival" not in ap:
        return pd.DataFrame()
    rate = [(a or {}).get("rate_rps") if isinstance(a, dict) else None for a in ap["arrival"]]
    out = ap.assign(rate_rps=pd.Series(rate, index=ap.index, dtype="float64"))
    return out[out["rate_rps"].notna()]


def _clean(p: pd.DataFrame) -> pd.DataFrame:
    """The phases other processes did not contaminate, when there are any; else all of them (marked in the table)."""
    if p.empty or "contaminated" not in p:
        return p
    clean = p[~p["contaminated"].fillna(False).astype(bool)]
    return clean if not clean.empty else p


def _by_rep(p: pd.DataFrame, col: str) -> dict[int, float]:
    if p.empty or col not in p:
        return {}
    return {int(r): float(v) for r, v in zip(p["repetition"], p[col], strict=True) if isnum(v)}


def rate_sweep_table(runs: list[RunData], verdict: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for run in runs:
        rp = _rate_phases(run)
        if rp.empty:
            continue
        rule = _rule(run)
        cfgs = run.manifest.configurations
        vrun = verdict[verdict["run"] == run.run_id] if not verdict.empty and "baseline" in verdict else pd.DataFrame()
        baseline_of = dict(zip(vrun["config"], vrun["baseline"], strict=True)) if not vrun.empty else {}
        for name in run.config_names:
            mine = rp[rp["config"] == name]
            base_name = baseline_of.get(name)
            base_name = base_name if isinstance(base_name, str) and base_name != name else None
            for rate in sorted(mine["rate_rps"].unique()):
                p_all = mine[mine["rate_rps"] == rate]
                p = _clean(p_all)  # contaminated repetitions left out where clean ones exist
                recs = cast("list[dict[str, Any]]", p.to_dict("records"))
                j = judge_rate(recs, rule)
                lat = median(p["e2e_from_schedule_p50_s"]) if "e2e_from_schedule_p50_s" in p else None
                gp = median(p["goodput_rps"]) if "goodput_rps" in p else None
                row: dict[str, Any] = {
                    "run": run.run_id,
                    "config": name,
                    "algorithm": (cfgs.get(name) or ConfigState()).algorithm,
                    "rate_rps": float(rate),
                    "load": str(p["load"].iloc[0]),
                    "repetitions": len(p_all),
                    "judged_on": len(p),
                    "offered_rps": median(p["offered_rps"]),
                    "achieved_rps": median(p["achieved_rps"]),
                    "completion_ratio": j.completion_ratio,
                    "late_share": j.late_share,
                    "goodput_rps": gp,
                    "slo_met_share": j.goodput_ratio,
                    "e2e_from_schedule_p50_s": lat,
                    "saturated": j.saturated,
                    "saturated_why": j.why,
                    "contaminated_phases": int(p_all["contaminated"].sum()) if "contaminated" in p_all else 0,
                    "baseline": base_name,
                    "latency_vs_baseline": None,
                    "goodput_vs_baseline": None,
                    "pays": None,
                }
                if base_name is not None:
                    b = _clean(rp[(rp["config"] == base_name) & (rp["rate_rps"] == rate)])
                    if not b.empty:
                        # paired by repetition (the same schedule and prompts; interleaved: the same block)
                        mine_lat, base_lat = (
                            _by_rep(p, "e2e_from_schedule_p50_s"),
                            _by_rep(b, "e2e_from_schedule_p50_s"),
                        )
                        lat_ratio, _, _ = ratio_interval(
                            [mine_lat[r] / base_lat[r] for r in mine_lat if base_lat.get(r)]
                        )
                        base_gp = median(b["goodput_rps"]) if "goodput_rps" in b else None
                        pa = pays_at(float(rate), lat_ratio, gp, base_gp)
                        row.update(
                            latency_vs_baseline=pa.latency_ratio, goodput_vs_baseline=pa.goodput_ratio, pays=pa.pays
                        )
                rows.append(row)
    return pd.DataFrame(rows)


def saturation_table(sweep: pd.DataFrame, break_even: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    if sweep.empty:
        return pd.DataFrame()
    for (run, name), grp in sweep.groupby(["run", "config"], sort=False):
        pts = [
            (float(r["rate_rps"]), Judgement(bool(r["saturated"]), r["saturated_why"] or "", None, None, None))
            for _, r in grp.iterrows()
        ]
        sp = saturation_point(pts)
        rates = sorted(float(x) for x in grp["rate_rps"])
        if sp.kind == "saturated":
            text = f"{_r(sp.saturation_rps)} rps ({sp.why})" + (
                f"; sustains {_r(sp.sustained_rps)} rps"
                if sp.sustained_rps is not None
                else "; already at the lowest rate"
            )
        elif sp.kind == "not reached":
            text = f"not reached: sustains ≥ {_r(sp.sustained_rps)} rps (highest rate measured)"
        else:
            text = "–"
        row: dict[str, Any] = {
            "run": run,
            "config": name,
            "algorithm": grp["algorithm"].iloc[0],
            "rates_measured": ", ".join(_r(x) for x in rates),
            "saturation_kind": sp.kind,
            "saturation_rps": sp.saturation_rps,
            "sustained_rps": sp.sustained_rps,
            "decided_by": sp.why,
            "saturation": text,
            "pays_kind": None,
            "pays_up_to_rps": None,
            "first_not_paying_rps": None,
            "stops_paying": None,
            "break_even_streams": None,
        }
        paid = grp[grp["pays"].notna()] if "pays" in grp else grp.iloc[0:0]
        if grp["algorithm"].iloc[0] not in (None, "none") and not paid.empty:
            pays = [
                PaysAt(
                    float(r["rate_rps"]), bool(r["pays"]), _f(r["latency_vs_baseline"]), _f(r["goodput_vs_baseline"])
                )
                for _, r in paid.iterrows()
            ]
            kind, up_to, first_not = stops_paying(pays)
            ev = ", ".join(
                f"{_r(p.rate_rps)}: latency {_x(p.latency_ratio)}"
                + (f", goodput {_x(p.goodput_ratio)}" if p.goodput_ratio is not None else "")
                for p in pays
            )
            head = {
                "crosses": f"pays up to {_r(up_to)} rps, not at {_r(first_not)}",
                "always": f"pays at every rate (up to {_r(up_to)} rps)",
                "never": "never: no rate where it beats the baseline",
                "mixed": f"mixed: highest rate it pays at {_r(up_to)} rps",
            }.get(kind, "–")
            row.update(
                pays_kind=kind, pays_up_to_rps=up_to, first_not_paying_rps=first_not, stops_paying=f"{head} ({ev})"
            )
        row["break_even_streams"] = _break_even(break_even, str(run), str(name), grp["algorithm"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def _break_even(break_even: pd.DataFrame, run: str, name: str, algorithm: Any) -> str | None:
    """The closed-loop break-even in streams of the configuration: its own run's, else (a run of open-loop phases only,
    reported together with a closed-loop run: ``specsoak report RUN_A RUN_B``) another run's of the same name."""
    if algorithm in (None, "none"):
        return None
    if not break_even.empty:
        known = break_even[(break_even["config"] == name) & (break_even["break_even_kind"] != "unknown")]
        mine = known[known["run"] == run]
        if not mine.empty:
            return str(mine["break_even"].iloc[0])
        if not known.empty:
            return f"{known['break_even'].iloc[0]} (run {known['run'].iloc[0]})"
    return "not measured in closed loop (report this run with one that has `streams`)"


def _f(v: Any) -> float | None:
    return float(v) if isnum(v) else None


def _r(v: Any) -> str:
    return f"{v:g}" if isnum(v) else "–"


def _x(v: Any) -> str:
    if not isnum(v):
        return "–"
    return "∞" if math.isinf(float(v)) else f"{float(v):.2f}×"
