"""How many different prompts each measured phase and each soak sent, and how many were sent again."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.common.stats import isnum
from harness.report.load import RunData


def prompts_table(runs: list[RunData]) -> pd.DataFrame:
    """How many different prompts each measured phase and each configuration's soak sent (docs/metrics.md#prompts):
    a prompt is a (prompt id, turn) pair, so a conversation's later turns count apart; ``repeated`` is requests
    that sent a prompt already sent in the same phase (or soak)."""
    from harness.records.columnar import soak_requests_frame
    from harness.records.files import SOAK_DIR

    rows: list[dict[str, Any]] = []
    for run in runs:
        phases = [df for df in (run.phases, run.arrival_phases) if not df.empty and "distinct_prompts" in df]
        after = [p for p in run.after_soak if p.get("distinct_prompts") is not None]
        for p in [r for df in phases for r in df.to_dict("records")] + after:
            if not isnum(p.get("distinct_prompts")):
                continue
            load = p.get("load") if isinstance(p.get("load"), str) else p.get("streams")
            rows.append(
                {
                    "run": run.run_id,
                    "config": p["config"],
                    "phase": p.get("phase"),
                    "load": str(load),
                    "repetition": p.get("repetition"),
                    "requests": int(p["requests"]),
                    "distinct_prompts": int(p["distinct_prompts"]),
                    "repeated": int(p["requests"]) - int(p["distinct_prompts"]),
                }
            )
        try:
            sr = soak_requests_frame(run.run_dir / SOAK_DIR, ["config", "prompt_id", "turn", "start_unix_s", "id"])
        except (OSError, ValueError, KeyError):  # records the report cannot read that way: no soak row
            sr = pd.DataFrame()
        if not sr.empty:
            sr = sr[sr["prompt_id"].notna()]  # records without a prompt id say nothing here
        for name, g in sr.groupby("config", sort=True) if not sr.empty else []:
            distinct = len(g[["prompt_id", "turn"]].fillna(0).drop_duplicates())
            rows.append(
                {
                    "run": run.run_id,
                    "config": name,
                    "phase": "soak",
                    "load": "",
                    "repetition": None,
                    "requests": len(g),
                    "distinct_prompts": distinct,
                    "repeated": len(g) - distinct,
                }
            )
    return pd.DataFrame(rows)
