"""What speculation buys and why: break-even concurrency, the acceptance model and roofline explanation, the K sweep."""

from __future__ import annotations

import json
from typing import Any, cast

import pandas as pd

from harness.common.stats import break_even, expected_tokens_per_step, isnum, number_or_none, shown_difference
from harness.report.load import RunData
from harness.report.tables.common import config_spec


def _solo_vs_n1(solo: Any, n1: Any) -> str:
    """Why the verdict's solo ratio and this table's ratio at 1 stream can tell different stories ('' when they agree)."""
    if not (isnum(solo) and isnum(n1)) or ((solo > 1.0) == (n1 > 1.0) and abs(float(solo) / float(n1) - 1.0) < 0.1):
        return ""
    return (
        f"solo decode {float(solo):.2f}× counts the decode rate after the first token; total t/s at N=1 {float(n1):.2f}× "
        f"also counts prompt processing and the first token, which speculation does not speed up"
    )


def breakeven_table(verdict: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for _, v in verdict.iterrows():
        if v["algorithm"] in (None, "none") or v.get("status") != "done":
            continue
        pts = [(n, float(v[f"speedup_{n}"])) for n in counts if isnum(v.get(f"speedup_{n}"))]
        be = break_even(pts)
        ev = be["evidence"]
        if be["kind"] == "crosses":
            (n1, s1), (n2, s2) = ev
            text = f"{be['streams']:.1f} streams (N={n1}: {s1:.2f}×, N={n2}: {s2:.2f}×)"
        elif be["kind"] == "never":
            text = f"never within measured N (still {ev[0][1]:.2f}× at N={ev[0][0]})"
        elif be["kind"] == "always":
            text = f"always: no gain even at N={ev[0][0]} ({ev[0][1]:.2f}×)"
        elif be["kind"] == "mixed":
            text = "mixed: " + ", ".join(f"N={n}: {s:.2f}×" for n, s in ev)
        else:
            text = "no measured speedup"
        # what the intervals show at each N: a point above 1.0 whose interval straddles it is no win
        shown = [
            f"N={n}: {shown_difference(v.get(f'speedup_{n}_ci_low'), v.get(f'speedup_{n}_ci_high')) or 'no interval'}"
            for n in counts
            if isnum(v.get(f"speedup_{n}"))
        ]
        rows.append(
            {
                "run": v["run"],
                "config": v["config"],
                "algorithm": v["algorithm"],
                "synthetic": bool(v["synthetic"]),
                "shown_by_intervals": ", ".join(shown),
                "solo_vs_n1": _solo_vs_n1(v.get("solo_speedup"), v.get("speedup_1")),
                "break_even_kind": be["kind"],
                "break_even_streams": be["streams"],
                "evidence": json.dumps([[int(n), round(float(s), 6)] for n, s in ev]),
                "break_even": text,
            }
        )
    return pd.DataFrame(rows)


# ---- explanation: acceptance model and roofline -------------------------------------------------
def _solo_decode(run: RunData, name: str) -> tuple[float, float, dict[int, dict[str, Any]]]:
    """(decode seconds, tokens after the first) of the 1-stream measured requests, and their phases by repetition."""
    rq = run.requests
    r = (
        rq[(rq["config"] == name) & (rq["phase"] == "measure") & (rq["streams"] == 1) & (rq["status"] == "ok")]
        if not rq.empty
        else rq
    )
    secs = toks = 0.0
    for out, tps in zip(r.get("output_tokens", []), r.get("decode_tps", []), strict=False):
        if isnum(out) and isnum(tps) and tps > 0 and out > 1:
            secs += (out - 1) / tps
            toks += out - 1
    ph = run.phases
    p = ph[(ph["config"] == name) & (ph["streams"] == 1)] if not ph.empty else ph
    by_rep = {int(rep): c for rep, c in zip(p.get("repetition", []), p.get("counters", []), strict=False)}
    return secs, toks, by_rep


def explain_table(runs: list[RunData], verdict: pd.DataFrame) -> pd.DataFrame:
    """Predicted solo speedup from α, K and the measured cost of a step, beside the measured one."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        first_base = next(
            (
                n
                for n in run.config_names
                if run.manifest.configurations[n].algorithm == "none"
                and run.manifest.configurations[n].status == "done"
            ),
            None,
        )
        if first_base is None:
            continue
        for name in run.config_names:
            meta = run.manifest.configurations[name]
            if meta.algorithm in (None, "none") or meta.status != "done":
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
            row: dict[str, Any] = {
                "run": run.run_id,
                "config": name,
                "algorithm": meta.get("algorithm"),
                "synthetic": bool(meta.get("synthetic")),
                "acceptance": alpha,
                "k": k,
                "k_source": k_source,
                "verify_steps": steps,
                "plain_steps": plain,
                "mean_accept_len": mean_len,
            }
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
            row["measured_solo_speedup"] = number_or_none(v["solo_speedup"].iloc[0]) if not v.empty else None
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
    k = config_spec(run, name).get("k")
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
        bw = run.manifest.machine.get("memory_bandwidth") or {}
        gbs = number_or_none(bw.get("gb_per_s"))
        for name in run.config_names:
            if run.manifest.configurations[name].algorithm != "none":
                continue
            cap = run.capacity.get(name, {})
            mib = number_or_none(cap.get("model_file_mib")) or number_or_none(
                (cap.get("target") or {}).get("model_mib")
            )
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            solo = number_or_none(v["solo_decode_tps"].iloc[0]) if not v.empty else None
            roof = gbs * 1e9 / (mib * 2**20) if gbs and mib else None
            rows.append(
                {
                    "run": run.run_id,
                    "config": name,
                    "bandwidth_gb_per_s": gbs,
                    "bandwidth_method": bw.get("method") or "not measured (run made before the measurement existed)",
                    "bytes_per_token_mib": mib,
                    "roofline_tps": roof,
                    "solo_decode_tps": solo,
                    "roofline_pct": 100.0 * solo / roof if solo and roof else None,
                }
            )
    return pd.DataFrame(rows)


# ---- K sweep ----------------------------------------------------------------------------------
def k_sweep_table(runs: list[RunData], verdict: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
    """One row per swept configuration (grouped by the configuration it was expanded from), with
    acceptance, mean length and t/s against K, and ``best_for``: the columns (solo, @N) at which
    this K gave the highest throughput within its group."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for name, meta in run.manifest.configurations.items():
            group = meta.sweep_of
            if not group:
                continue
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            if v.empty:
                continue
            spec = config_spec(run, name)
            syn = (spec.get("synthetic") or {}).get("length")
            row: dict[str, Any] = {
                "run": run.run_id,
                "sweep": group,
                "config": name,
                "algorithm": meta.get("algorithm"),
                "k": meta.get("k"),
                "synthetic_length": syn,
                "acceptance": number_or_none(v["acceptance"].iloc[0]),
                "mean_accept_len": number_or_none(v["mean_accept_len"].iloc[0]),
                "solo_decode_tps": number_or_none(v["solo_decode_tps"].iloc[0]),
            }
            for n in counts:
                row[f"total_tps_{n}"] = number_or_none(v[f"total_tps_{n}"].iloc[0]) if f"total_tps_{n}" in v else None
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
                best[int(cast("int", vals.idxmax()))].append(label)
    df["best_for"] = [", ".join(best[i]) for i in df.index]
    return df.sort_values(["run", "sweep", "synthetic_length", "k"], na_position="first").reset_index(drop=True)
