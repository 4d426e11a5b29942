"""``specsoak report``: report.md, verdict.csv/.parquet and plots, from run folders alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.report.load import RunData, load_run  # noqa: E402
from harness.report.verdict import display_table, stream_counts, verdict_table  # noqa: E402


@dataclass(frozen=True)
class Report:
    out_dir: Path
    markdown: Path
    verdict: pd.DataFrame
    display: pd.DataFrame


def build_report(run_dirs: list[Path], out_dir: Path | None = None) -> Report:
    runs = [load_run(d) for d in run_dirs]
    out = out_dir or (run_dirs[0] if len(run_dirs) == 1 else run_dirs[0].parent / ("combined-" + "-".join(r.run_id for r in runs))[:200])
    out.mkdir(parents=True, exist_ok=True)
    table = verdict_table(runs)
    counts = stream_counts(runs)
    shown = display_table(table, counts, multi_run=len(runs) > 1) if not table.empty else pd.DataFrame()
    table.to_csv(out / "verdict.csv", index=False)
    table.to_parquet(out / "verdict.parquet", index=False)
    plot = out / "tps_vs_streams.png"
    plot_tps_vs_streams(table, counts, plot)
    md = out / "report.md"
    md.write_text(render_markdown(runs, table, shown, plot.name), encoding="utf-8")
    return Report(out, md, table, shown)


def plot_tps_vs_streams(table: pd.DataFrame, counts: list[int], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for _, row in table.iterrows():
        xs, ys = [], []
        for n in counts:
            v = row.get(f"total_tps_{n}")
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                xs.append(n)
                ys.append(v)
        if not xs:
            continue
        label = str(row["config"]) + (" [synthetic]" if row["synthetic"] else "")
        style = "--" if row["algorithm"] == "none" else "-"
        ax.plot(xs, ys, style, marker="o", label=label, linewidth=2 if row["algorithm"] == "none" else 1.5)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("total output tokens/s (wall)")
    ax.set_xticks(counts)
    ax.set_title("Throughput against concurrency")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def render_markdown(runs: list[RunData], table: pd.DataFrame, shown: pd.DataFrame, plot_name: str) -> str:
    lines = ["# specsoak report", ""]
    for run in runs:
        m = run.manifest
        mach = m.get("machine", {})
        lines += [
            f"- run `{run.run_id}`: scenario **{m.get('scenario')}**, engine {m.get('engine')} {m.get('engine_version') or ''}, "
            f"status **{m.get('status')}** ({m.get('stop_reason')})",
            f"  - machine: {mach.get('cpu_model', '?')}, {mach.get('cores', '?')} cores, {mach.get('mem_total_mib', '?')} MiB",
        ]
    lines += ["", "## Verdict", ""]
    if shown.empty:
        lines += ["No configuration was measured.", ""]
    else:
        lines += [shown.to_markdown(index=False), ""]
        lines += [
            "Solo decode t/s: median per-request decode rate at 1 stream. Total t/s @N: all output tokens of the",
            "phase over its wall time. Acceptance = accepted / drafted tokens; mean length = 1 + accepted / verify",
            "steps (the bonus token counted), both from the engine's own /metrics deltas. Slots, ctx and memory come",
            "from the engine's start-up log. Definitions: docs/metrics.md. `[synthetic]` rows use the engine's",
            "synthetic acceptance: their speed is a cost measurement and their output is not valid.",
            "",
        ]
    lines += [f"![total t/s against streams]({plot_name})", ""]
    notes = _notes(runs, table)
    if notes:
        lines += ["## Notes", "", *notes, ""]
    return "\n".join(lines)


def _notes(runs: list[RunData], table: pd.DataFrame) -> list[str]:
    out: list[str] = []
    for _, row in table.iterrows():
        if isinstance(row.get("failure"), str) and row["failure"]:
            out.append(f"- **{row['config']}** failed: {row['failure']}")
        if row.get("contaminated_phases"):
            out.append(
                f"- **{row['config']}**: {int(row['contaminated_phases'])} phase(s) contaminated: other processes used up to "
                f"{row['other_cores_max']:.3f} cores while it was measured; treat its figures with care."
            )
        drafted, client = row.get("drafted_tokens"), row.get("client_drafted_tokens")
        if _num(drafted) and _num(client) and drafted != client:
            out.append(f"- **{row['config']}**: engine counted {drafted:.0f} drafted tokens, responses summed to {client:.0f}.")
    for run in runs:
        hc = [c.get("harness_cores") for c in run.phases["cpu"]] if not run.phases.empty else []
        if hc:
            out.append(f"- Harness CPU during measurement (run {run.run_id}): median {pd.Series(hc).median():.3f} cores, max {max(hc):.3f}.")
    return out


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
