"""The report's plots (matplotlib, Agg), written as PNG without a timestamp so rebuilds are identical."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.common.stats import isnum
from harness.config.policy import DRAWN_VERDICT_KINDS
from harness.report.load import RunData

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _label(run: str, config: str, synthetic: bool, multi: bool) -> str:
    return (f"{run} / " if multi else "") + config + (" [synthetic]" if synthetic else "")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path


def tps_vs_streams(verdict: pd.DataFrame, counts: list[int], breakeven: pd.DataFrame, path: Path, multi: bool) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=110)
    for i, (_, row) in enumerate(verdict.iterrows()):
        pts = [(n, row.get(f"total_tps_{n}")) for n in counts if isnum(row.get(f"total_tps_{n}"))]
        if not pts:
            continue
        color = _COLORS[i % len(_COLORS)]
        base = row["algorithm"] == "none"
        ax.plot(
            [p[0] for p in pts],
            [math.nan if p[1] is None else p[1] for p in pts],  # a gap, as matplotlib draws None
            "--" if base else "-",
            marker="o",
            color=color,
            linewidth=2 if base else 1.5,
            label=_label(row["run"], row["config"], bool(row["synthetic"]), multi),
        )
        if not breakeven.empty:
            be = breakeven[(breakeven["run"] == row["run"]) & (breakeven["config"] == row["config"])]
            if not be.empty and be["break_even_kind"].iloc[0] == "crosses":
                x = float(be["break_even_streams"].iloc[0])
                ax.axvline(x, color=color, linestyle=":", linewidth=1.2)
                ax.annotate(
                    f"break-even {x:.1f}",
                    (x, ax.get_ylim()[1]),
                    textcoords="offset points",
                    xytext=(3, -12 - 10 * (i % 3)),
                    fontsize=7,
                    color=color,
                )
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("total output tokens/s (wall)")
    if counts:
        ax.set_xticks(counts)
    ax.set_title("Throughput against concurrency (dotted: break-even with the baseline)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    return _save(fig, path)


def acceptance_over_time(runs: list[RunData], path: Path) -> Path | None:
    series = []
    for run in runs:
        by_cfg: dict[str, list[dict[str, Any]]] = {}
        for w in run.soak_windows:
            by_cfg.setdefault(w["config"], []).append(w)
        for cfg, wins in sorted(by_cfg.items()):
            pts = sorted((float(w["t_unix"]), w.get("acceptance"), w.get("decode_tps")) for w in wins)
            series.append((run.run_id, cfg, pts))
    if not series:
        return None
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7.5, 5.2), dpi=110, sharex=True)
    multi = len(runs) > 1
    for i, (run_id, cfg, pts) in enumerate(series):
        t0 = pts[0][0]
        label = _label(run_id, cfg, False, multi)
        acc = [((t - t0) / 3600, a) for t, a, _ in pts if isnum(a)]
        dec = [((t - t0) / 3600, d) for t, _, d in pts if isnum(d)]
        if acc:
            ax1.plot([p[0] for p in acc], [p[1] for p in acc], marker=".", color=_COLORS[i % len(_COLORS)], label=label)
        if dec:
            ax2.plot([p[0] for p in dec], [p[1] for p in dec], marker=".", color=_COLORS[i % len(_COLORS)], label=label)
    ax1.set_ylabel("acceptance (per window)")
    ax1.set_title("Soak: acceptance and decode speed over time")
    ax2.set_ylabel("median decode t/s")
    ax2.set_xlabel("hours since the configuration's first soak window (wall clock)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    return _save(fig, path)


def soak_timeline(runs: list[RunData], path: Path) -> Path | None:
    """Every soak window against the engine's uptime: output t/s, decode t/s, TTFT p95, engine and harness memory,
    CPU split; collapse verdicts as red lines, recoveries green, windows not judged drawn hollow."""
    series: list[tuple[str, str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    for run in runs:
        by_cfg: dict[str, list[dict[str, Any]]] = {}
        for w in run.soak_windows:
            by_cfg.setdefault(w["config"], []).append(w)
        for cfg, wins in sorted(by_cfg.items()):
            verdicts = [v for v in run.soak_verdicts if v.get("config") == cfg]
            series.append((run.run_id, cfg, sorted(wins, key=lambda w: float(w["t_unix"])), verdicts))
    if not series:
        return None
    fig, axes = plt.subplots(5, 1, figsize=(8.5, 11.0), dpi=100, sharex=True)
    multi = len(runs) > 1
    panels = (
        ("output_tps", "output t/s (window)"),
        ("decode_tps", "median decode t/s\n(open loop: requests alone)"),
        ("ttft_p95_s", "TTFT p95 s"),
    )
    longest = max(float(s[2][-1]["t_unix"]) - float(s[2][0]["t_unix"]) for s in series)
    unit_s, unit = (3600.0, "hours") if longest >= 2 * 3600 else (60.0, "minutes")
    for i, (run_id, cfg, wins, verdicts) in enumerate(series):
        colour = _COLORS[i % len(_COLORS)]
        label = _label(run_id, cfg, False, multi)
        # x: hours of engine uptime when one engine lived through the soak, else hours since the first window
        one_engine = len({w.get("engine_pid") for w in wins}) == 1 and all(
            isnum(w.get("engine_uptime_s")) for w in wins
        )
        t0 = float(wins[0]["t_unix"])
        x = [(float(w["engine_uptime_s"]) if one_engine else float(w["t_unix"]) - t0) / unit_s for w in wins]
        judged = [bool(w.get("judged", True)) for w in wins]
        open_loop = any("alone_decode_tps" in w for w in wins)
        for ax, (key, ylabel) in zip(axes[:3], panels, strict=True):
            if key == "decode_tps" and open_loop:
                key = "alone_decode_tps"  # the decode an open-loop soak judges (docs/detector.md#alone-decode)
            pts = [(xx, w.get(key), j) for xx, w, j in zip(x, wins, judged, strict=True) if isnum(w.get(key))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, lw=0.8, label=label)
            ax.scatter([p[0] for p in pts if p[2]], [p[1] for p in pts if p[2]], s=6, color=colour)
            ax.scatter(
                [p[0] for p in pts if not p[2]],
                [p[1] for p in pts if not p[2]],
                s=8,
                facecolors="none",
                edgecolors=colour,
                lw=0.6,
            )
            ax.set_ylabel(ylabel)
        rss = [(xx, w.get("engine_rss_mib")) for xx, w in zip(x, wins, strict=True) if isnum(w.get("engine_rss_mib"))]
        har = [(xx, w.get("harness_rss_mib")) for xx, w in zip(x, wins, strict=True) if isnum(w.get("harness_rss_mib"))]
        axes[3].plot([p[0] for p in rss], [p[1] for p in rss], color=colour, label=f"{label} engine")
        axes[3].plot([p[0] for p in har], [p[1] for p in har], color=colour, ls="--", label=f"{label} harness + Locust")
        cpu = [(xx, w["cpu"]) for xx, w in zip(x, wins, strict=True) if isinstance(w.get("cpu"), dict)]
        for key, ls, what in (
            ("engine_cores", "-", "engine"),
            ("harness_cores", "--", "harness + Locust"),
            ("other_cores", ":", "other processes"),
        ):
            axes[4].plot(
                [p[0] for p in cpu], [p[1].get(key) for p in cpu], color=colour, ls=ls, label=f"{label} {what}"
            )
        for v in verdicts:
            if v.get("kind") not in (*DRAWN_VERDICT_KINDS, "recovered"):
                continue
            up: Any = v.get("engine_uptime_s") if one_engine else float(v["t_unix"]) - t0  # a number, or not shown
            if not isnum(up):
                continue
            for ax in axes:
                ax.axvline(
                    float(up) / unit_s,
                    color={"recovered": "tab:green"}.get(str(v["kind"]), "tab:red"),
                    lw=0.8,
                    alpha=0.7,
                )
    axes[3].set_ylabel("resident MiB")
    axes[4].set_ylabel("CPU cores")
    axes[0].set_title(
        f"Soak windows (hollow: not judged; red: a {', '.join(DRAWN_VERDICT_KINDS)} verdict; green: recovered)",
        fontsize=9,
    )
    axes[-1].set_xlabel(
        f"engine uptime, {unit}"
        if all(len({w.get("engine_pid") for w in s[2]}) == 1 for s in series)
        else f"{unit} since the first soak window"
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


# the aligned timeline of a flagged configuration: (window field or series, axis label), each on its own axis
_FAILURE_PANELS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("output_tps",), "output t/s"),
    (("decode_tps", "alone_decode_tps"), "decode t/s"),
    (("ttft_p95_s",), "TTFT p95 s"),
    (("acceptance", "kv_usage", "prefix_hit_rate", "error_ratio"), "share"),
    (("longest_stall_s",), "longest stall s"),
    (("requests_running", "requests_waiting", "preemptions"), "requests"),
    (("engine_rss_mib", "engine_anon_mib", "prompt_cache_mib", "engine_memory_mib"), "MiB"),
    (("engine_cores",), "engine CPU cores"),
)


def failure_timelines(runs: list[RunData], out: Path) -> list[Path]:
    """One figure per configuration with a collapse, stall, divergence, memory, crash or hang verdict: every window
    series on its own axis against engine uptime, aligned, each verdict's onset marked (docs/soak.md#why)."""
    from harness.soak.explain import series_value

    paths: list[Path] = []
    for run in runs:
        by_cfg: dict[str, list[dict[str, Any]]] = {}
        for w in run.soak_windows:
            by_cfg.setdefault(w["config"], []).append(w)
        for cfg, wins in sorted(by_cfg.items()):
            flagged = [v for v in run.soak_verdicts if v.get("config") == cfg and v.get("kind") in DRAWN_VERDICT_KINDS]
            if not flagged:
                continue
            wins = sorted(wins, key=lambda w: float(w["t_unix"]))
            t0 = float(wins[0].get("t_start_unix") or wins[0]["t_unix"])
            x = [(float(w["t_unix"]) - t0) / 60.0 for w in wins]
            panels = [
                (keys, label)
                for keys, label in _FAILURE_PANELS
                if any(series_value(w, k) is not None for w in wins for k in keys)
            ]
            fig, axes = plt.subplots(
                len(panels), 1, figsize=(8.5, 1.6 * len(panels) + 1.0), dpi=100, sharex=True, squeeze=False
            )
            for ax, (keys, label) in zip(axes[:, 0], panels, strict=True):
                for k in keys:
                    pts = [(xx, val) for xx, w in zip(x, wins, strict=True) if (val := series_value(w, k)) is not None]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.9, marker=".", ms=3, label=k)
                ax.set_ylabel(label, fontsize=8)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=6, loc="best")
                for v in flagged:
                    onset = float((v.get("evidence") or {}).get("onset_unix") or v["t_unix"])
                    ax.axvline((onset - t0) / 60.0, color="tab:red", lw=0.9, alpha=0.8)
            first = flagged[0]
            axes[0, 0].set_title(
                f"{cfg}: {first['kind']}"
                + (f" of {first['metric']}" if first.get("metric") else "")
                + " (red: onset of each verdict)",
                fontsize=9,
            )
            axes[-1, 0].set_xlabel("minutes since the first soak window")
            raw = f"{run.run_id}_{cfg}" if len(runs) > 1 else cfg
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in raw)
            paths.append(_save(fig, out / f"failure_timeline_{name}.png"))
    return paths


def latency_distributions(runs: list[RunData], path: Path) -> Path | None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.5, 4.0), dpi=110)
    multi = len(runs) > 1
    i = 0
    drawn = False
    for run in runs:
        rq = run.requests
        if rq.empty:
            continue
        ok = rq[(rq["phase"] == "measure") & (rq["status"] == "ok")]
        counts = sorted(int(n) for n in ok["streams"].unique())
        for name in run.config_names:
            mine = ok[ok["config"] == name]
            if mine.empty:
                continue
            color = _COLORS[i % len(_COLORS)]
            i += 1
            for n, style in ((counts[0], "-"), (counts[-1], "--")) if len(counts) > 1 else ((counts[0], "-"),):
                at = mine[mine["streams"] == n]
                ttft = np.sort(at["ttft_s"].dropna().to_numpy(dtype=float))
                itl = np.sort(np.array([x for lst in at["itl_s"] for x in (lst or [])], dtype=float))
                label = f"{_label(run.run_id, name, False, multi)} @{n}"
                if len(ttft):
                    ax1.plot(
                        ttft,
                        np.arange(1, len(ttft) + 1) / len(ttft),
                        style,
                        color=color,
                        label=label,
                        drawstyle="steps-post",
                    )
                    drawn = True
                if len(itl):
                    ax2.plot(itl * 1e3, np.arange(1, len(itl) + 1) / len(itl), style, color=color, label=label)
    if not drawn:
        plt.close(fig)
        return None
    ax1.set_xlabel("TTFT (s)")
    ax1.set_ylabel("share of requests ≤ x")
    ax1.set_title("TTFT distribution (solid: fewest streams, dashed: most)")
    ax2.set_xlabel("inter-token latency (ms, log)")
    ax2.set_xscale("log")
    ax2.set_ylabel("share of gaps ≤ x")
    ax2.set_title("ITL distribution")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    return _save(fig, path)


_MEM_PARTS = (
    ("target_weights_mib", "target weights"),
    ("target_kv_mib", "target KV"),
    ("drafter_weights_mib", "drafter weights"),
    ("draft_kv_mib", "draft KV"),
    ("compute_mib", "compute / verification buffers"),
    ("recurrent_mib", "recurrent state"),
)


def memory_bars(memory: pd.DataFrame, path: Path, multi: bool) -> Path | None:
    if memory.empty or "target_weights_mib" not in memory:
        return None
    mem = memory[memory["target_weights_mib"].notna()]
    if mem.empty:
        return None
    labels = [_label(r, c, bool(s), multi) for r, c, s in zip(mem["run"], mem["config"], mem["synthetic"], strict=True)]
    fig, ax = plt.subplots(figsize=(9.0, 1.4 + 0.55 * len(mem)), dpi=110)
    left = np.zeros(len(mem))
    for j, (col, name) in enumerate(_MEM_PARTS):
        vals = mem[col].fillna(0.0).to_numpy(dtype=float)
        if not vals.any():
            continue
        ax.barh(labels, vals, left=left, label=name, color=_COLORS[j % len(_COLORS)])
        left += vals
    budgets = sorted({float(b) for b in mem["memory_budget_mib"] if isnum(b)})
    for b in budgets:
        ax.axvline(b, color="black", linestyle=":", linewidth=1)
        ax.annotate(f"budget {b:,.0f} MiB", (b, 0), textcoords="offset points", xytext=(3, -14), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MiB (from the engine's start-up log)")
    ax.set_title("Memory per configuration")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def k_sweep(verdict: pd.DataFrame, runs: list[RunData], counts: list[int], path: Path) -> Path | None:
    """Speedup and acceptance against K, per sweep (a configuration expanded over k) or per algorithm."""
    ks: dict[tuple[str, str], list[tuple[int, float | None, float | None, float | None]]] = {}
    for run in runs:
        for name, c in run.manifest.configurations.items():
            if not c.k or c.algorithm == "none" or (c.synthetic and not c.sweep_of):
                continue
            v = verdict[(verdict["run"] == run.run_id) & (verdict["config"] == name)]
            if v.empty:
                continue
            top = counts[-1] if counts else None
            syn = ((c.spec or {}).get("synthetic") or {}).get("length")
            group = (c.sweep_of or c.algorithm or "") + (f" L={syn:g}" if syn else "")
            ks.setdefault((run.run_id, group), []).append(
                (
                    int(c.k),
                    _f(v["solo_speedup"].iloc[0]),
                    _f(v[f"speedup_{top}"].iloc[0]) if top else None,
                    _f(v["acceptance"].iloc[0]),
                )
            )
    sweeps = {key: sorted(pts) for key, pts in ks.items() if len({p[0] for p in pts}) >= 2}
    if not sweeps:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.5, 4.0), dpi=110)
    for i, ((run_id, alg), pts) in enumerate(sorted(sweeps.items())):
        color = _COLORS[i % len(_COLORS)]
        label = f"{run_id} / {alg}" if len(runs) > 1 else alg
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1] for p in pts], "-o", color=color, label=f"{label} solo")
        if counts:
            ax1.plot(xs, [p[2] for p in pts], "--s", color=color, label=f"{label} @{counts[-1]}")
        ax2.plot(xs, [p[3] for p in pts], "-o", color=color, label=label)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_xlabel("K (draft length)")
    ax1.set_ylabel("speedup vs baseline")
    ax1.set_title("K sweep: speedup")
    ax2.set_xlabel("K (draft length)")
    ax2.set_ylabel("acceptance")
    ax2.set_title("K sweep: acceptance")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _f(v: Any) -> float | None:
    return float(v) if isnum(v) and not math.isinf(float(v)) else None


def control_over_time(control: pd.DataFrame, summary: pd.DataFrame, path: Path, multi: bool) -> Path | None:
    """The machine's speed over the run: each baseline's solo decode t/s block by block, against minutes since the
    run's first block, with the drift bound around the median (docs/reports.md#control)."""
    if control.empty or len(control) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=110)
    t0 = float(control["start_unix_s"].min())
    for i, ((run_id, base), g) in enumerate(control.groupby(["run", "baseline"], sort=False)):
        g = g.sort_values("start_unix_s")
        color = _COLORS[i % len(_COLORS)]
        x = [(float(t) - t0) / 60 for t in g["start_unix_s"]]
        ax.plot(
            x,
            list(g["control_decode_tps"]),
            marker="o",
            color=color,
            label=_label(str(run_id), str(base), False, multi),
        )
        for xx, rep in zip(x, g["repetition"], strict=True):
            ax.annotate(
                str(int(rep)),
                (xx, float(g[g["repetition"] == rep]["control_decode_tps"].iloc[0])),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
                color=color,
            )
        s = summary[(summary["run"] == run_id) & (summary["baseline"] == base)] if not summary.empty else summary
        if not s.empty:
            med, bound = float(s["control_median_tps"].iloc[0]), float(s["drift_bound"].iloc[0])
            ax.axhspan(med * (1 - bound / 2), med * (1 + bound / 2), color=color, alpha=0.08)
            if bool(s["drifted"].iloc[0]):
                ax.annotate(
                    f"drifted: spread {float(s['control_spread'].iloc[0]):.0%} > {bound:.0%}",
                    (0.01, 0.04 + 0.08 * i),
                    xycoords="axes fraction",
                    fontsize=8,
                    color="tab:red",
                )
    ax.set_xlabel("minutes since the first block")
    ax.set_ylabel("baseline solo decode t/s")
    ax.set_title("Control: the machine's speed, block by block (band: the drift bound)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def rate_sweep(sweep: pd.DataFrame, saturation: pd.DataFrame, path: Path, multi: bool) -> Path | None:
    """Achieved (solid) and goodput (dotted) requests per second against the offered rate, per configuration; the
    diagonal is 'achieved = offered'; a cross marks each configuration's saturation point (harness/detect/saturation.py)."""
    if sweep.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=110)
    top = 0.0
    for i, ((run, name), grp) in enumerate(sweep.groupby(["run", "config"], sort=False)):
        g = grp.sort_values("rate_rps")
        color = _COLORS[i % len(_COLORS)]
        offered = [
            o if (o := _f(v)) is not None else float(r) for v, r in zip(g["offered_rps"], g["rate_rps"], strict=True)
        ]
        achieved = [_f(v) for v in g["achieved_rps"]]
        base = g["algorithm"].iloc[0] == "none"
        ax.plot(
            offered,
            [a if a is not None else np.nan for a in achieved],
            "--" if base else "-",
            marker="o",
            color=color,
            linewidth=2 if base else 1.5,
            label=_label(str(run), str(name), False, multi) + " achieved",
        )
        gp = [_f(v) for v in g["goodput_rps"]] if "goodput_rps" in g else []
        if any(v is not None for v in gp):
            ax.plot(
                offered,
                [v if v is not None else np.nan for v in gp],
                ":",
                marker=".",
                color=color,
                label=f"{name} goodput",
            )
        top = max([top, *offered, *(a for a in achieved if a is not None)])
        sat = (
            saturation[(saturation["run"] == run) & (saturation["config"] == name)]
            if not saturation.empty
            else saturation
        )
        if not sat.empty and isnum(sat["saturation_rps"].iloc[0]):
            x = float(sat["saturation_rps"].iloc[0])
            at = g[g["rate_rps"] == x]
            y = _f(at["achieved_rps"].iloc[0]) if not at.empty else None
            off = _f(at["offered_rps"].iloc[0]) if not at.empty else None
            ax.plot(
                [off if off is not None else x],
                [y if y is not None else 0.0],
                "x",
                color=color,
                markersize=12,
                markeredgewidth=2.5,
            )
            ax.annotate(
                f"saturated {x:g} rps",
                (off if off is not None else x, y or 0.0),
                textcoords="offset points",
                xytext=(6, -14 - 10 * (i % 3)),
                fontsize=7,
                color=color,
            )
    ax.plot([0, top * 1.05], [0, top * 1.05], color="grey", linewidth=0.8, alpha=0.6, label="achieved = offered")
    ax.set_xlabel("offered requests/s")
    ax.set_ylabel("requests/s (wall)")
    ax.set_title("Request-rate sweep: achieved (solid), goodput (dotted), saturation (×)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)
