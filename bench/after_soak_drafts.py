"""What a drafter did before, during and after its soak, from a run folder's request records (issue #33's n-gram
question: is a configuration slower after its soak because it drafts differently?).

    .venv/bin/python -m bench.after_soak_drafts results/<run> [--bucket-min 5]

Per configuration: the measurement phases before the soak and after it (decode t/s of each answer, tokens drafted
and accepted per answer, acceptance), then the soak in buckets of engine time: the same figures for the answers
that ran alone (no other answer of the soak streaming beside them), so that concurrency does not move them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.records.files import read_jsonl


def _figures(r: pd.DataFrame) -> dict[str, object]:
    ok = r[r["status"] == "ok"]
    drafted = ok["draft_tokens"].fillna(0).astype(float)
    accepted = ok["accepted_tokens"].fillna(0).astype(float)
    return {
        "answers": len(ok),
        "decode_tps_p50": round(float(ok["decode_tps"].median()), 1) if len(ok) else None,
        "drafted_per_answer": round(float(drafted.mean()), 1) if len(ok) else None,
        "accepted_per_answer": round(float(accepted.mean()), 1) if len(ok) else None,
        "drafted_per_token": round(float(drafted.sum() / ok["output_tokens"].sum()), 2) if len(ok) else None,
        "acceptance": round(float(accepted.sum() / drafted.sum()), 3) if drafted.sum() else None,
    }


def _alone(soak: pd.DataFrame) -> pd.Series:
    """True for an answer no other answer overlapped (start to end of its stream)."""
    start = soak["start_unix_s"].astype(float)
    end = start + soak["e2e_s"].astype(float)
    alone = [int(((start < e) & (end > s)).sum()) == 1 for s, e in zip(start, end, strict=True)]
    return pd.Series(alone, index=soak.index)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--bucket-min", type=float, default=5.0)
    args = ap.parse_args()
    req = pd.DataFrame(list(read_jsonl(args.run / "requests.jsonl")))
    soak = pd.DataFrame([r for f in sorted((args.run / "soak").glob("*.jsonl")) for r in read_jsonl(f)])
    rows = []
    for (config, phase), grp in req[req["phase"].isin(["measure", "after_soak"])].groupby(["config", "phase"]):
        rows.append({"config": config, "when": "before" if phase == "measure" else "after", **_figures(grp)})
    if not soak.empty:
        for config, grp in soak.groupby("config"):
            grp = grp[grp["status"] == "ok"].sort_values("start_unix_s")
            grp = grp[_alone(grp)]
            t0 = float(grp["start_unix_s"].min())
            bucket = ((grp["start_unix_s"].astype(float) - t0) // (args.bucket_min * 60)).astype(int)
            for b, part in grp.groupby(bucket):
                lo = b * args.bucket_min
                rows.append(
                    {"config": config, "when": f"soak {lo:.0f}-{lo + args.bucket_min:.0f} min, alone", **_figures(part)}
                )
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
