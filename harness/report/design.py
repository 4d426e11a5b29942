"""How a run was measured, and whether the machine held still: the design, the control, two runs compared.

* **Design.** ``interleaved`` (the default): repetition r is a block measuring every configuration once, in an
  order shuffled per block from the recorded seed; ``sequential``: all repetitions of one configuration, then
  the next. The manifest's ``design`` says which, with the seed and each block's order.
* **Control.** Each baseline's solo decode t/s, block by block (repetition by repetition): a baseline decodes
  the same way in every block, so its spread over the run is the machine's drift. A run whose control spread
  ((max − min) / median) exceeds ``measurement.control_drift_max`` is flagged.
* **Compare.** Two runs of one scenario side by side: per configuration and figure, whether each run's value
  lies inside the other's 95% interval.

From run folders alone, like every table (docs/reports.md).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.common.stats import isnum
from harness.report.load import RunData
from harness.report.verdict import solo_by_rep

DEFAULT_DRIFT_MAX = 0.20  # harness/config/schema.py Measurement.control_drift_max's default


def design_of(run: RunData) -> dict[str, Any]:
    """The run's design record; runs recorded before designs existed were sequential."""
    d = run.manifest.design
    return d if isinstance(d, dict) and d.get("kind") else {"kind": "sequential"}


def control_table(runs: list[RunData]) -> pd.DataFrame:
    """One row per (run, baseline, repetition): the baseline's solo decode t/s in that block, and when it ran."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        cfgs = run.manifest.configurations
        rq = run.requests
        if rq.empty:
            continue
        starts = _block_starts(run)
        for name, meta in cfgs.items():
            if meta.get("algorithm") != "none":
                continue
            by_rep = solo_by_rep(rq, name)
            when = (
                rq[(rq["config"] == name) & (rq["phase"] == "measure") & (rq["streams"] == 1)]
                .groupby("repetition")["start_unix_s"]
                .min()
            )
            for rep, tps in sorted(by_rep.items()):
                t = float(when.get(rep, float("nan")))
                rows.append(
                    {
                        "run": run.run_id,
                        "baseline": name,
                        "repetition": rep,
                        "control_decode_tps": tps,
                        "start_unix_s": t,
                        "block_start_unix_s": starts.get(rep),
                    }
                )
    return pd.DataFrame(rows)


def control_summary(runs: list[RunData], control: pd.DataFrame) -> pd.DataFrame:
    """Per (run, baseline): the control's spread over the run against the scenario's bound, and the flag."""
    rows: list[dict[str, Any]] = []
    if control.empty:
        return pd.DataFrame()
    bounds = {
        run.run_id: float((run.scenario.get("measurement") or {}).get("control_drift_max") or DEFAULT_DRIFT_MAX)
        for run in runs
    }
    for (run_id, base), g in control.groupby(["run", "baseline"], sort=False):
        xs = [float(v) for v in g["control_decode_tps"] if isnum(v)]
        if not xs:
            continue
        med = float(pd.Series(xs).median())
        spread = (max(xs) - min(xs)) / med if med > 0 and len(xs) > 1 else None
        g = g.sort_values("start_unix_s")
        first_last = (
            float(g["control_decode_tps"].iloc[-1]) / float(g["control_decode_tps"].iloc[0]) - 1 if len(g) > 1 else None
        )
        bound = bounds.get(str(run_id), DEFAULT_DRIFT_MAX)
        rows.append(
            {
                "run": run_id,
                "baseline": base,
                "blocks": len(xs),
                "control_median_tps": med,
                "control_min_tps": min(xs),
                "control_max_tps": max(xs),
                "control_spread": spread,
                "first_to_last": first_last,
                "drift_bound": bound,
                "drifted": bool(spread is not None and spread > bound),
            }
        )
    return pd.DataFrame(rows)


def design_notes(runs: list[RunData], verdict: pd.DataFrame) -> list[str]:
    """What each run's design was and what its intervals rest on: how many pairs, what varies between them."""
    out: list[str] = []
    for run in runs:
        d = design_of(run)
        m = run.scenario.get("measurement") or {}
        reps = int(m.get("repetitions") or 1)
        pairs = _pairs(verdict, run.run_id)
        pair_text = f"{pairs} paired repetitions per ratio" if pairs is not None else "no paired ratio"
        if d["kind"] == "interleaved":
            orders = "; ".join(
                f"block {b.get('repetition')}: {', '.join(b.get('order') or [])}" for b in d.get("blocks") or []
            )
            out.append(
                f"Measurement design (run {run.run_id}): **interleaved**, {reps} blocks, order seed {d.get('order_seed')} "
                f"({orders}); each block measured every configuration once on a fresh engine, so the two sides of a "
                f"pair are seconds apart. {pair_text.capitalize()}; between pairs the prompts differ (each repetition "
                f"has its own) and so does the order."
            )
        else:
            out.append(
                f"Measurement design (run {run.run_id}): **sequential** (all repetitions of one configuration, then the "
                f"next): the two sides of a pair are minutes apart, so a machine that drifts over minutes lands on "
                f"whichever configuration was running, and the intervals do not see it. {pair_text.capitalize()}; "
                f"between pairs the prompts differ."
            )
    return out


def _pairs(verdict: pd.DataFrame, run_id: str) -> int | None:
    if verdict.empty or "solo_speedup_reps" not in verdict:
        return None
    v = verdict[(verdict["run"] == run_id) & verdict["solo_speedup"].map(isnum)]
    return int(v["solo_speedup_reps"].min()) if not v.empty else None


def _block_starts(run: RunData) -> dict[int, float]:
    return {
        int(b["repetition"]): float(b["start_unix_s"])
        for b in design_of(run).get("blocks") or []
        if isinstance(b, dict) and isnum(b.get("repetition")) and isnum(b.get("start_unix_s"))
    }


# ---- two runs side by side ------------------------------------------------------------------------
def compare_table(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per configuration both verdict tables have and per ratio (solo, @N): both values with their intervals, the
    difference, and whether each lies inside the other's 95% interval (``agree``: yes / no / '–' without intervals)."""
    counts = sorted(
        {
            int(c.removeprefix("speedup_"))
            for df in (a, b)
            for c in df.columns
            if c.startswith("speedup_") and c.removeprefix("speedup_").isdigit()
        }
    )
    figures = [("solo", "solo_speedup")] + [(f"@{n}", f"speedup_{n}") for n in counts]
    rows: list[dict[str, Any]] = []
    for _, ra in a.iterrows():
        match = b[b["config"] == ra["config"]]
        if match.empty or ra["config"] == ra.get("baseline"):  # a baseline against itself is 1.0 by construction
            continue
        rb = match.iloc[0]
        for label, key in figures:
            va, vb = ra.get(key), rb.get(key)
            if not (isnum(va) and isnum(vb)):
                continue
            la, ha, lb, hb = (
                ra.get(f"{key}_ci_low"),
                ra.get(f"{key}_ci_high"),
                rb.get(f"{key}_ci_low"),
                rb.get(f"{key}_ci_high"),
            )
            both = all(isnum(x) for x in (la, ha, lb, hb))
            agree = (la <= vb <= ha and lb <= va <= hb) if both else None
            rows.append(
                {
                    "config": ra["config"],
                    "figure": f"{label} vs baseline",
                    "run_a": va,
                    "run_a_ci_low": la,
                    "run_a_ci_high": ha,
                    "run_b": vb,
                    "run_b_ci_low": lb,
                    "run_b_ci_high": hb,
                    "difference": vb / va - 1 if va else None,
                    "agree": agree,
                }
            )
    return pd.DataFrame(rows)


def compare_summary(table: pd.DataFrame) -> dict[str, Any]:
    """How many figures agree, and the median absolute relative difference of the ratios."""
    if table.empty:
        return {"figures": 0, "agree": 0, "disagree": 0, "no_interval": 0, "median_abs_difference": None}
    judged = table["agree"].map(lambda v: v is not None and not (isinstance(v, float) and pd.isna(v)))
    diffs = table["difference"].map(lambda v: abs(float(v)) if isnum(v) else None).dropna()
    return {
        "figures": len(table),
        "agree": int((table["agree"] == True).sum()),  # noqa: E712  a column of True/False/None
        "disagree": int((table["agree"] == False).sum()),  # noqa: E712  a column of True/False/None
        "no_interval": int((~judged).sum()),
        "median_abs_difference": float(diffs.median()) if len(diffs) else None,
    }
