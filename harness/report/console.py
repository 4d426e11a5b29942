"""The verdict as a terminal shows it: seed 000's table sized to the screen, then one line per finding.

The report (and ``--wide``) keeps every column. Here a configuration name is never cut: when the table is wider
than the screen, each configuration becomes a short block of lines instead. A ratio carries ``*`` when its 95%
interval excludes 1.0 (a difference the run shows), none when it straddles it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.common.stats import isnum, number_or_none

SHOWN_MARK = "*"  # after a ratio whose interval excludes 1.0


def verdict_stream_counts(verdict: pd.DataFrame) -> list[int]:
    """The closed-loop stream counts the verdict has (its ``total_tps_N`` columns), ascending."""
    return sorted(
        int(c.removeprefix("total_tps_")) for c in verdict.columns if c.startswith("total_tps_") and c[10:].isdigit()
    )


def _num(v: Any, fmt: str) -> str:
    return format(float(v), fmt) if isnum(v) and math.isfinite(float(v)) else "–"


def _ratio(v: Any, lo: Any, hi: Any, is_baseline: bool) -> str:
    if is_baseline:
        return "base"
    if not isnum(v):
        return "–"
    shown = isnum(lo) and isnum(hi) and (float(lo) > 1.0 or float(hi) < 1.0)
    return f"{float(v):.2f}×" + (SHOWN_MARK if shown else "")


def _servable(v: Any, fill: Any, ctx: Any) -> str:
    if isnum(v):
        return f"{float(v):,.0f}" + (" ✓" if fill == "ok" else " ✗" if fill in ("failed", "engine_failed") else "")
    return _num(ctx, ",.0f")


def compact_verdict(verdict: pd.DataFrame) -> pd.DataFrame:
    """Seed 000's columns: solo decode and its ratio, total t/s at the highest N and its ratio, acceptance, servable
    context per slot, max streams, and the soak's outcome when there is one."""
    counts = verdict_stream_counts(verdict)
    n = counts[-1] if counts else None
    multi = "run" in verdict and verdict["run"].nunique() > 1
    rows = []
    for _, r in verdict.iterrows():
        base = r.get("config") == r.get("baseline")
        name = str(r["config"]) + (" [synthetic]" if str(r.get("synthetic")) == "True" else "")
        row: dict[str, str] = {"configuration": f"{r['run']}: {name}" if multi else name}
        row["solo t/s"] = _num(r.get("solo_decode_tps"), ".1f")
        row["solo ×"] = _ratio(r.get("solo_speedup"), r.get("solo_speedup_ci_low"), r.get("solo_speedup_ci_high"), base)
        if n is not None:
            row[f"t/s @{n}"] = _num(r.get(f"total_tps_{n}"), ".1f")
            row[f"@{n} ×"] = _ratio(
                r.get(f"speedup_{n}"), r.get(f"speedup_{n}_ci_low"), r.get(f"speedup_{n}_ci_high"), base
            )
        row["accept"] = _num(r.get("acceptance"), ".2f")
        row["ctx/slot"] = _servable(r.get("servable_ctx_per_slot"), r.get("fill_check"), r.get("ctx_per_slot"))
        row["max streams"] = (
            ("≥" if str(r.get("max_streams_is_lower_bound")) == "True" else "") + f"{int(r['max_streams'])}"
            if isnum(r.get("max_streams"))
            else "–"
        )
        if "soak" in verdict and verdict["soak"].map(lambda v: isinstance(v, str) and v != "").any():
            row["soak"] = r["soak"] if isinstance(r.get("soak"), str) and r["soak"] else "–"
        if r.get("failure") and isinstance(r.get("failure"), str):
            row["solo t/s"] = "failed"
        rows.append(row)
    return pd.DataFrame(rows)


def findings(verdict: pd.DataFrame) -> list[str]:
    """One line per thing that matters: each configuration's ratios where the run shows a difference, failures, soaks."""
    counts = verdict_stream_counts(verdict)
    n = counts[-1] if counts else None
    out = []
    for _, r in verdict.iterrows():
        name = str(r["config"])
        if isnum(r.get("records_missing")) and float(r["records_missing"]) > 0 and isnum(r.get("records_expected")):
            exp = int(r["records_expected"])
            out.append(
                f"{name}: request records read ✗ {exp - int(r['records_missing'])} of {exp}: its figures rest on what "
                f"could be read (see the notes)"
            )
        if isinstance(r.get("failure"), str) and r["failure"]:
            out.append(f"{name}: failed: {r['failure']}")
            continue
        if r.get("config") != r.get("baseline"):
            parts = []
            for label, key in (("solo", "solo_speedup"), (f"at {n} streams", f"speedup_{n}") if n else (None, None)):
                if key is None or not isnum(r.get(key)):
                    continue
                lo, hi, v = (
                    number_or_none(r.get(f"{key}_ci_low")),
                    number_or_none(r.get(f"{key}_ci_high")),
                    float(r[key]),
                )
                if lo is not None and hi is not None and (lo > 1.0 or hi < 1.0):
                    parts.append(f"{'faster' if v > 1 else 'slower'} {label} ({v:.2f}× [{lo:.2f}, {hi:.2f}])")
                elif lo is not None and hi is not None:
                    parts.append(f"no difference shown {label} ({v:.2f}× [{lo:.2f}, {hi:.2f}])")
            if parts:
                out.append(f"{name} against {r.get('baseline')}: " + ", ".join(parts))
        soak = r.get("soak")
        if isinstance(soak, str) and soak.startswith("✗"):
            out.append(f"{name}: soak {soak[1:].strip()}")
    return out


def render(table: pd.DataFrame, width: int) -> list[str]:
    """The table as aligned text when it fits ``width``; else one block of lines per row (names whole either way)."""
    if table.empty:
        return []
    cols = list(table.columns)
    cells = [[str(v) for v in row] for row in table.itertuples(index=False)]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    if sum(widths) + 2 * (len(cols) - 1) <= width:

        def line(values: list[str]) -> str:
            return "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
            ).rstrip()

        return [line(cols), line(["─" * w for w in widths]), *(line(row) for row in cells)]
    out = []
    for row in cells:
        out.append(row[0])
        current = ""
        for pair in (f"{c} {v}" for c, v in zip(cols[1:], row[1:], strict=True)):
            candidate = f"{current} · {pair}" if current else f"  {pair}"
            if current and len(candidate) > width:
                out.append(current)
                candidate = f"  {pair}"
            current = candidate
        if current:
            out.append(current)
    return out


def console_lines(verdict: pd.DataFrame, width: int) -> list[str]:
    """What ``run``, ``resume`` and ``report`` print: the compact verdict, a legend, the findings."""
    if verdict.empty:
        return []
    lines = ["specsoak verdict", *render(compact_verdict(verdict), width)]
    lines.append(
        f"(× against the baseline; {SHOWN_MARK}: its 95% interval excludes 1.0; ctx/slot: servable under the memory "
        f"budget, ✓ proven by the fill check)"
    )
    lines += [f"- {f}" for f in findings(verdict)]
    return [ln if len(ln) <= width else _wrap(ln, width) for ln in lines]


def _wrap(line: str, width: int) -> str:
    import textwrap

    return "\n".join(
        textwrap.wrap(line, width=width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    )
