"""Losslessness: speculative outputs against the baseline's (greedy token by token, sampled by a chi-square test)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.report.load import RunData


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
            first = min(
                (int(r["first_diff_token"]) for r in div if r.get("first_diff_token") is not None), default=None
            )
            rows.append(
                {
                    "run": run.run_id,
                    "config": cfg,
                    "algorithm": recs[0].get("algorithm"),
                    "synthetic": bool(recs[0].get("synthetic")),
                    "streams": n,
                    "reference": ref,
                    "method": recs[0].get("method"),
                    "prompts": len(recs),
                    "identical": same,
                    "diverged": len(div),
                    "errors": len(err),
                    "earliest_divergence_token": first,
                    "drafted_tokens": sum(int(r.get("draft_tokens") or 0) for r in recs),
                    "divergences": "; ".join(f"{r['prompt_id']}@{r.get('first_diff_token')}" for r in div) or "none",
                    "verdict": _verify_verdict(recs, same, div, err),
                }
            )
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
    rows = [
        dict(run_id=run.run_id, **{k: v for k, v in r.items() if k != "counts"})
        for run in runs
        for r in run.verify_dist
    ]
    df = pd.DataFrame(rows)
    return df.rename(columns={"run_id": "run"}) if not df.empty else df
