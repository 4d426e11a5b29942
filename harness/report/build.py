"""``specsoak report``: report.md, a self-contained report.html, every table as CSV and Parquet,
and the plots, from run folders alone (several runs combine: one row per run and configuration)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.common.stats import isnum
from harness.report import plots
from harness.report.campaign import campaign_notes, campaign_of, hardware_of, merge_verdict
from harness.report.console import findings
from harness.report.design import control_summary, control_table, design_notes
from harness.report.load import RunData, load_run
from harness.report.render import Block, h, img, p, table, to_html, to_markdown, ul
from harness.report.sweep import rate_sweep_table, saturation_table
from harness.report.tables.memory import max_streams_table, memory_table
from harness.report.tables.prompts import prompts_table
from harness.report.tables.soak import after_soak_table, degraded_after_soak, soak_table
from harness.report.tables.speculation import breakeven_table, explain_table, k_sweep_table, roofline_table
from harness.report.tables.verify import verify_distribution_table, verify_table
from harness.report.verdict import display_table, stream_counts, verdict_table
from harness.soak.disk import engine_log_notes

TABLES = (
    "verdict",
    "control",
    "control_summary",
    "memory",
    "max_streams",
    "break_even",
    "explanation",
    "roofline",
    "k_sweep",
    "rate_sweep",
    "saturation",
    "soak",
    "after_soak",
    "verify",
    "verify_distribution",
    "prompts",
)
PLOTS = (
    "tps_vs_streams.png",
    "control.png",
    "acceptance_over_time.png",
    "soak_timeline.png",
    "latency.png",
    "memory.png",
    "k_sweep.png",
    "rate_sweep.png",
)


@dataclass(frozen=True)
class Report:
    out_dir: Path
    markdown: Path
    verdict: pd.DataFrame
    display: pd.DataFrame
    html: Path | None = None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    images: tuple[Path, ...] = ()
    read_problems: tuple[str, ...] = ()  # lines of the run folders that could not be read (also in the notes)


def build_report(
    run_dirs: list[Path],
    out_dir: Path | None = None,
    slo: dict[str, float] | None = None,
    memory_budget_mib: float | None = None,
) -> Report:
    runs = [load_run(d) for d in run_dirs]
    multi = len(runs) > 1
    out = out_dir or (
        run_dirs[0]
        if len(run_dirs) == 1
        else run_dirs[0].parent / ("combined-" + "-".join(r.run_id for r in runs))[:200]
    )
    out.mkdir(parents=True, exist_ok=True)
    counts = stream_counts(runs)
    verdict = verdict_table(runs)
    tables: dict[str, pd.DataFrame] = {"verdict": verdict}
    tables["max_streams"] = max_streams_table(runs, slo)
    if not verdict.empty and not tables["max_streams"].empty:
        ms = tables["max_streams"][["run", "config", "max_streams", "max_streams_is_lower_bound"]]
        verdict = verdict.merge(ms, on=["run", "config"], how="left")
        tables["verdict"] = verdict
    tables["control"] = control_table(runs)
    tables["control_summary"] = control_summary(runs, tables["control"])
    tables["memory"] = memory_table(runs, memory_budget_mib)
    mem = tables["memory"]
    if not verdict.empty and not mem.empty and "servable_ctx_per_slot" in mem:
        verdict = verdict.merge(
            mem[["run", "config", "servable_ctx_per_slot", "fill_check"]], on=["run", "config"], how="left"
        )
        tables["verdict"] = verdict
    tables["break_even"] = breakeven_table(verdict, counts) if not verdict.empty else pd.DataFrame()
    tables["explanation"] = explain_table(runs, verdict) if not verdict.empty else pd.DataFrame()
    tables["roofline"] = roofline_table(runs, verdict) if not verdict.empty else pd.DataFrame()
    tables["k_sweep"] = k_sweep_table(runs, verdict, counts) if not verdict.empty else pd.DataFrame()
    tables["rate_sweep"] = rate_sweep_table(runs, verdict)
    tables["saturation"] = saturation_table(tables["rate_sweep"], tables["break_even"])
    tables["soak"] = soak_table(runs)
    tables["after_soak"] = after_soak_table(runs)
    if not verdict.empty and "soak" in verdict:  # a configuration slower after its soak: a finding in its soak cell
        worse = degraded_after_soak(tables["after_soak"])
        verdict["soak"] = [
            f"{cell}; {worse[(str(r), str(c))]}" if (str(r), str(c)) in worse else cell
            for r, c, cell in zip(verdict["run"], verdict["config"], verdict["soak"], strict=True)
        ]
        tables["verdict"] = verdict
    # the hardware beside every figure; a campaign's folders (--no-soak, --soak-config) merged into one verdict
    hw = {r.run_id: hardware_of(r).label() for r in runs}
    campaign = campaign_of(runs)
    if not verdict.empty and campaign is not None:
        verdict = merge_verdict(verdict, campaign)
    elif not verdict.empty and len(runs) > 1:  # one run: one machine, named in the header
        verdict["measured_on"] = verdict["run"].map(hw)
    tables["verdict"] = verdict
    if len(runs) > 1 and not tables["soak"].empty and "run" in tables["soak"]:
        tables["soak"].insert(1, "soaked_on", tables["soak"]["run"].map(hw))
    tables["verify"] = verify_table(runs)
    tables["verify_distribution"] = verify_distribution_table(runs)
    tables["prompts"] = prompts_table(runs)
    for name in TABLES:
        df = tables[name]
        for ext in ("csv", "parquet"):
            (out / f"{name}.{ext}").unlink(missing_ok=True)  # a table that has no rows now leaves no stale file
        if name == "verdict" or not df.empty:
            df.to_csv(out / f"{name}.csv", index=False)
            df.to_parquet(out / f"{name}.parquet", index=False)

    for name in PLOTS:
        (out / name).unlink(missing_ok=True)
    for stale in out.glob("failure_timeline_*.png"):
        stale.unlink()
    images: dict[str, Any] = {
        "tps": plots.tps_vs_streams(verdict, counts, tables["break_even"], out / "tps_vs_streams.png", multi)
        if not verdict.empty
        else None,
        "control": plots.control_over_time(tables["control"], tables["control_summary"], out / "control.png", multi),
        "acc": plots.acceptance_over_time(runs, out / "acceptance_over_time.png"),
        "soak": plots.soak_timeline(runs, out / "soak_timeline.png"),
        "failures": plots.failure_timelines(runs, out),
        "lat": plots.latency_distributions(runs, out / "latency.png"),
        "mem": plots.memory_bars(tables["memory"], out / "memory.png", multi),
        "k": plots.k_sweep(verdict, runs, counts, out / "k_sweep.png") if not verdict.empty else None,
        "sweep": plots.rate_sweep(tables["rate_sweep"], tables["saturation"], out / "rate_sweep.png", multi),
    }
    shown = display_table(verdict, counts, multi_run=multi) if not verdict.empty else pd.DataFrame()
    if not shown.empty:
        shown.insert(
            len(shown.columns) - 1,
            "max streams (SLO)",
            [
                _max_streams(v, lb)
                for v, lb in zip(
                    verdict.get("max_streams", [None] * len(verdict)),
                    verdict.get("max_streams_is_lower_bound", [False] * len(verdict)),
                    strict=True,
                )
            ],
        )
    blocks = _blocks(runs, tables, shown, images, multi)
    md = out / "report.md"
    md.write_text(to_markdown(blocks), encoding="utf-8")
    page = out / "report.html"
    page.write_text(to_html(blocks, "specsoak report: " + ", ".join(r.run_id for r in runs)), encoding="utf-8")
    return Report(
        out,
        md,
        verdict,
        shown,
        page,
        tables,
        tuple(p for i in images.values() for p in (i if isinstance(i, list) else [i]) if p is not None),
        tuple(read_problems(runs)),
    )


# ---- the document ---------------------------------------------------------------------------------
def _blocks(
    runs: list[RunData], t: dict[str, pd.DataFrame], shown: pd.DataFrame, images: dict[str, Any], multi: bool
) -> list[Block]:
    b: list[Block] = [h(1, "specsoak report")]
    items = []
    for run in runs:
        m = run.manifest
        mach = m.machine
        bw = (mach.get("memory_bandwidth") or {}).get("gb_per_s")
        items.append(
            f"run `{run.run_id}`: scenario **{m.scenario}**, engine {m.engine} {m.engine_version or ''}, "
            f"status **{m.status}** ({m.stop_reason}); machine: {mach.get('cpu_model', '?')}, {mach.get('cores', '?')} cores, "
            f"{mach.get('mem_total_mib', '?')} MiB" + (f", memory bandwidth {bw:.1f} GB/s" if isnum(bw) else "")
        )
    b.append(ul(items))

    b.append(h(2, "Verdict"))
    if shown.empty:
        b.append(p("No configuration was measured."))
    else:
        b += [
            table(shown),
            p(
                "Solo decode t/s: median per-request decode rate at 1 stream. Total t/s @N: all output tokens of the phase over its",
                "wall time. `vs baseline`: against the `algorithm: none` configuration serving the same target model (or the one named",
                "by `baseline:`), the geometric mean of the paired ratios (repetition r of the configuration over repetition r of its",
                "baseline: the same prompts, and in the interleaved design the same block, seconds apart); the bracket is its 95%",
                "Student-t interval, on the logarithms (`[–]` with fewer than two pairs); `no difference shown` when it straddles 1.0.",
                "The design and what differs between pairs: see *Measurement design* below. "
                "Acceptance = accepted / drafted tokens; mean length = 1 + accepted / verify steps",
                "(bonus token counted), from the engine's /metrics deltas. Max streams: the largest N meeting the SLO, from the ramp or the",
                "measured N (see below; `≥`: no N tried failed). Slots, ctx and memory: the engine's start-up log. `[synthetic]` rows use synthetic",
                "acceptance: their speed is a cost measurement, their output is not valid. Definitions: docs/metrics.md.",
            ),
        ]
        found = findings(t["verdict"])
        if found:
            b.append(ul(found))
        if any(str(c).startswith("offered / achieved rps") for c in shown.columns):
            b.append(
                p(
                    "Open-loop phases (`measurement.arrival`), one set of columns per rate (`@R rps`) or stage list: offered = scheduled",
                    "requests / the schedule's span, achieved = successful requests / the phase's wall time, goodput = requests meeting",
                    "every per-request SLO bound (TTFT and end-to-end counted from the scheduled time) / wall time, medians over the",
                    "repetitions (`–`: no SLO set); late = requests sent after their time because `max_in_flight` were in flight (or the",
                    "client fell behind), summed, with the longest delay. Achieved below offered, or late sends, mean the configuration",
                    "did not keep up with that rate. Definitions: docs/metrics.md#open-loop-phases.",
                )
            )
    if images["tps"]:
        b.append(img(images["tps"], "total t/s against streams"))

    b.append(h(2, "Measurement design and the machine's speed"))
    b.append(ul(design_notes(runs, t["verdict"])))
    cs = t["control_summary"]
    if cs.empty:
        b.append(p("No baseline was measured at 1 stream: no control for the machine's speed."))
    else:
        cols = {
            "baseline": "control (baseline)",
            "blocks": "blocks",
            "control_median_tps": "median solo t/s",
            "control_min_tps": "min",
            "control_max_tps": "max",
            "control_spread": "spread",
            "first_to_last": "first → last",
            "drift_bound": "bound",
            "drifted": "drifted",
        }
        b += [
            table(_show(cs, ["run"] * multi + list(cols), cols)),
            p(
                "The control is each baseline's solo decode t/s in each block (repetition): the same configuration every time, so",
                "its spread ((max − min) / median) is the machine's drift over the run. `drifted`: the spread exceeds the scenario's",
                "`measurement.control_drift_max`; in the interleaved design every configuration saw the same drift, in the",
                "sequential design it landed on whichever configuration was running.",
            ),
        ]
        if images.get("control"):
            b.append(img(images["control"], "control: baseline solo decode t/s block by block"))

    b.append(h(2, "Break-even concurrency"))
    be = t["break_even"]
    if be.empty:
        b.append(p("No speculative configuration was measured against a baseline."))
    else:
        be_cols = ["config", "algorithm", "break_even", "shown_by_intervals"] + (
            ["solo_vs_n1"] if (be["solo_vs_n1"] != "").any() else []
        )
        b += [
            table(
                _show(
                    be,
                    ["run"] * multi + be_cols,
                    {
                        "break_even": "stops beating the baseline at",
                        "shown_by_intervals": "what the intervals show",
                        "solo_vs_n1": "why solo and N=1 differ",
                    },
                )
            ),
            p(
                "The stream count from which a configuration's total t/s no longer exceeds the baseline's, linearly interpolated",
                "between the last measured N where it wins and the first where it does not (the two points in brackets), from the",
                "point estimates. `what the intervals show`: at each N, `faster` or `slower` only when the ratio's 95% interval",
                "excludes 1.0; `no difference shown` when it straddles 1.0.",
            ),
        ]

    sat = t["saturation"]
    if not sat.empty:
        b.append(h(2, "Request-rate sweep: saturation"))
        b += [
            table(
                _show(
                    sat,
                    ["run"] * multi
                    + ["config", "algorithm", "rates_measured", "saturation", "stops_paying", "break_even_streams"],
                    {
                        "rates_measured": "rates (rps)",
                        "saturation": "saturates at",
                        "stops_paying": "where speculation stops paying (rps)",
                        "break_even_streams": "break-even (streams)",
                    },
                )
            ),
            p(
                "Open-loop phases at each rate of `measurement.arrival.rate_rps`, rates ascending. A rate is saturated when the responses",
                "complete at less than `completion_ratio_min` of the rate the requests were scheduled at (both first to last, so the",
                "tail of the last answers does not count), or more than `late_share_max` of the requests were sent late, or, with an",
                "SLO, fewer than `goodput_ratio_min` met it (bounds: `measurement.arrival.saturation`; medians over the repetitions).",
                "Saturates at: the first saturated rate and the bound(s) it crossed; sustains: the highest rate below it. Where",
                "speculation stops paying: the rates at which the configuration's median latency from the scheduled time is below",
                "its baseline's (paired by repetition) with no less goodput; the break-even in streams (closed loop) beside it.",
                "Repetitions contaminated by other processes' CPU are left out of both judgements where clean ones exist (`judged on`).",
            ),
        ]
        rs = t["rate_sweep"]
        cols = {
            "rate_rps": "rate",
            "offered_rps": "offered rps",
            "achieved_rps": "achieved rps",
            "completion_ratio": "completions / schedule",
            "late_share": "late share",
            "goodput_rps": "goodput rps",
            "slo_met_share": "met SLO",
            "e2e_from_schedule_p50_s": "latency p50 s",
            "saturated_why": "saturated",
            "latency_vs_baseline": "latency vs baseline",
            "goodput_vs_baseline": "goodput vs baseline",
            "pays": "pays",
            "repetitions": "reps",
            "judged_on": "judged on",
            "contaminated_phases": "contaminated phases",
        }
        shown_rs = rs.assign(
            saturated_why=[w if s_ else "no" for s_, w in zip(rs["saturated"], rs["saturated_why"], strict=True)]
        )
        b.append(table(_show(shown_rs, ["run"] * multi + ["config"] + list(cols), cols)))
        if images.get("sweep"):
            b.append(img(images["sweep"], "request-rate sweep: achieved and goodput against offered"))

    b.append(h(2, "Max streams under the SLO"))
    ms = t["max_streams"]
    if not ms.empty:
        src = ms["slo_source"].iloc[0]
        limits = [f"per-stream decode t/s ≥ {_g(v)}" for v in ms["slo_per_stream_tps_min"].iloc[:1] if isnum(v)]
        limits += [f"TTFT p95 ≤ {_g(v)} s" for v in ms["slo_ttft_p95_s_max"].iloc[:1] if isnum(v)]
        slo_text = (
            f"SLO ({src}): " + ", ".join(limits) + ", and no failed request."
            if src != "none: no failed request"
            else "The scenario has no `slo:` section: a stream count counts as served when none of its requests failed."
        )
        shown_ms = ms.assign(
            max_streams=[
                _max_streams(v, lb) for v, lb in zip(ms["max_streams"], ms["max_streams_is_lower_bound"], strict=True)
            ]
        )
        ramped = bool((ms["max_streams_source"] == "adaptive ramp").any())
        b += [
            p(slo_text),
            table(
                _show(
                    shown_ms,
                    ["run"] * multi
                    + ["config", "max_streams", "slots", "max_streams_source", "first_failing", "evidence"],
                    {
                        "max_streams": "max streams",
                        "slots": "slots (engine log)",
                        "max_streams_source": "found by",
                        "first_failing": "first N that failed",
                    },
                )
            ),
            p(
                *(
                    [
                        "Adaptive ramp (the scenario's `slo.ramp`): after the measurement, N doubles from `start` while the SLO holds,",
                        "then bisects between the last N that held and the first that did not; evidence lists every N tried, in order.",
                        "`≥` when the ramp reached its `max_streams` without a failure.",
                    ]
                    if ramped
                    else [
                        "From the measured stream counts (the scenario has no `slo.ramp`): the largest N at which it and every smaller",
                        "measured N met the SLO; `≥` when every measured N met it.",
                    ]
                ),
                "Slots are what the engine reported at start-up; a setting that raises slots but not max streams fixes nothing.",
            ),
        ]

    b.append(h(2, "Memory"))
    mem = t["memory"]
    if mem.empty or "target_weights_mib" not in mem:
        b.append(p("No capacity was recorded."))
    else:
        cols = {
            "drafter_weights_mib": "drafter weights MiB",
            "target_kv_kib_per_token": "target KV KiB/token",
            "draft_kv_kib_per_token": "draft KV KiB/token",
            "compute_mib": "compute/verify buffers MiB",
            "recurrent_mib": "recurrent state MiB",
            "recurrent_cells": "state slots",
            "total_mib": "total MiB",
            "memory_budget_mib": "budget MiB",
            "servable_ctx_total": "servable ctx (all slots)",
            "servable_ctx_per_slot": "servable ctx/slot",
            "servable_ctx_vs_baseline": "vs baseline",
            "gpu_used_mib": "GPU used MiB",
            "engine_gpu_mib": "engine GPU MiB",
        }
        shown = _show(mem, ["run"] * multi + ["config"] + list(cols), cols)
        for c in ("GPU used MiB", "engine GPU MiB"):  # not sampled is n/a, never 0 (harness/probe/gpu.py)
            if c in shown:
                shown[c] = shown[c].replace("–", "n/a")
        b += [
            table(shown),
            p(
                "From the start-up log (capacity/*.json). KV per token = the KV buffer over the context it holds (ctx total);",
                "servable context = (budget − weights − compute buffers − recurrent state) / (target + draft KV per token),",
                "the budget from the scenario's `report.memory_budget_mib` (– when none is given).",
                "GPU used / engine GPU: the peak over the measurement phases of all GPUs' used memory and of the engine's",
                "processes' share, through NVML (n/a: not sampled; memory.csv's `gpu_note` says why).",
            ),
        ]
        checked = mem[mem["fill_check"] != "not run"] if "fill_check" in mem else mem.iloc[0:0]
        if checked.empty:
            b.append(
                p(
                    "Computed, not probed: the scenario's `report.fill_check` was off, so no engine was restarted at that context."
                )
            )
        else:
            fcols = {
                "fill_check": "fill check",
                "fill_started_ctx_total": "started with ctx",
                "fill_ctx_per_slot": "ctx/slot (log)",
                "fill_tokens_per_slot": "tokens filled/slot",
                "fill_log_total_mib": "log total MiB",
                "fill_rss_peak_mib": "peak RSS MiB",
                "fill_overflow_refused": "past ctx refused",
                "fill_detail": "detail",
            }
            b += [
                table(_show(checked, ["run"] * multi + ["config"] + list(fcols), fcols)),
                p(
                    "Checked: each configuration was started again with the servable context (rounded down to whole 256-token",
                    "blocks per slot), every slot was filled at once to within a few tokens of its context, the engine's resident",
                    "memory (process tree RSS, runtime included, which the log does not count) was sampled meanwhile, and one",
                    "prompt past the context had to be refused as a context overflow. `ok`: all slots filled and the overflow refused.",
                ),
            ]
        if images["mem"]:
            b.append(img(images["mem"], "memory per configuration"))

    b.append(h(2, "Why: acceptance, step cost and the roofline"))
    ex = t["explanation"]
    if ex.empty:
        b.append(p("No speculative configuration to explain."))
    else:
        cols = {
            "acceptance": "α",
            "k": "K",
            "k_source": "K from",
            "expected_tokens_per_step": "E[tokens/step] from α,K",
            "mean_accept_len": "measured tokens/step",
            "step_cost_in_baseline_tokens": "step cost (baseline tokens)",
            "break_even_acceptance": "α needed to break even",
            "predicted_solo_speedup": "predicted solo speedup",
            "measured_solo_speedup": "measured solo speedup",
        }
        b += [
            table(_show(ex, ["run"] * multi + ["config"] + list(cols), cols)),
            p(
                "E[tokens/step] = (1 − α^(K+1)) / (1 − α): the tokens one verification step yields if each drafted token is accepted",
                "independently with probability α (bonus token included). Step cost: the solo requests' decode time, minus the steps",
                "that verified no draft priced at the baseline's time per token, over the engine's verify steps, in units of the",
                "baseline's time per token: it is the drafting and verification cost together. Predicted speedup =",
                "(steps × E + plain steps) / (steps × cost + plain steps). A speedup needs E above the step cost: `α needed to break even`",
                "solves E = cost at this K (empty when even perfect acceptance cannot pay for the step).",
            ),
        ]
    rf = t["roofline"]
    if not rf.empty:
        cols = {
            "bandwidth_gb_per_s": "bandwidth GB/s",
            "bytes_per_token_mib": "MiB read per token",
            "roofline_tps": "roofline t/s",
            "solo_decode_tps": "baseline solo t/s",
            "roofline_pct": "% of roofline",
            "bandwidth_method": "bandwidth measured by",
        }
        b += [
            table(_show(rf, ["run"] * multi + ["config"] + list(cols), cols)),
            p(
                "Roofline t/s = memory bandwidth / model file size: decoding one token reads every weight once. The bandwidth is a",
                "single-threaded numpy copy measured once at the start of the run (manifest.json, machine.memory_bandwidth).",
            ),
        ]

    if images["lat"]:
        b += [h(2, "Latency distributions"), img(images["lat"], "TTFT and ITL distributions")]

    b.append(h(2, "Soak"))
    sk = t["soak"]
    if sk.empty:
        b.append(p("No soak in these runs."))
    else:
        cols = {
            "soak_verdict": "soak",
            "first_failure": "first failure",
            "first_failure_engine_uptime_h": "at engine uptime h",
            "max_engine_uptime_h": "longest engine uptime h",
            "collapse_episodes": "collapse episodes",
            "duration_s": "duration s",
            "requests": "requests",
            "offered_rps": "offered rps",
            "achieved_rps": "achieved rps",
            "goodput_rps": "goodput rps",
            "late": "late sends",
            "failures": "failures",
            "failures_by_kind": "by kind",
            "time_to_first_failure_s": "first failure after s",
            "failures_per_hour": "failures/h",
            "restarts": "restarts",
            "drift": "drift verdicts",
            "overload": "overloaded at",
            "canary": "output canary",
            "coverage": "windows judged",
            "not_judged": "not judged: why",
            "contaminated_windows": "contaminated windows",
            "engine_cores": "engine cores",
            "harness_cores": "harness cores (incl. Locust)",
            "longest_stall_s": "longest stall s",
            "stall_trend_s_per_h": "stall trend s/h",
            "stall_verdicts": "stall verdicts",
            "peak_engine_memory_mib": "peak engine memory MiB",
            "peak_swap_mib": "peak swap MiB",
            "engine_requests_done": "requests served",
            "engine_output_tokens_done": "tokens served",
        }
        b.append(table(_show(sk, ["run"] * multi + ["config"] + list(cols), cols)))
        for _, row in sk.iterrows():
            if row.get("prompt_cache") and row["prompt_cache"] != "none":
                b.append(
                    p(
                        f"Prompt cache of {row['config']}: {row['prompt_cache']}. Its growth is left out of the memory the",
                        "watchdog judges (`engine_memory_mib`, docs/soak.md#memory).",
                    )
                )
            if row.get("not_reported"):
                b.append(
                    p(
                        f"Not reported by {row['config']}'s engine: {row['not_reported']}. Those series are absent from its",
                        "windows and panels, not zero.",
                    )
                )
            if row.get("why"):
                b.append(p(f"Why {row['config']}'s soak was flagged: {row['why']}."))
        b.append(
            p(
                "Windows judged (a verdict's silence counts only beside them): "
                + " | ".join(str(row["coverage_detail"]) for _, row in sk.iterrows())
                + "."
            )
        )
        b.append(
            p(
                "A collapse is a watched window series (output t/s, decode t/s, in an open-loop soak that of the requests",
                "that ran alone, TTFT p95, error share, acceptance, engine memory) that left its reference at the same load",
                "level and stayed there (docs/soak.md); the engine uptime",
                "is the age of the engine process when the watchdog flagged it. Windows contaminated by other processes'",
                "CPU, or in an engine's warm-up, are recorded but not judged. The output canary: fixed greedy prompts",
                "answered every few minutes, compared with the configuration's first answers and its baseline's (docs/soak.md#output-canary).",
            )
        )
        for _, row in sk.iterrows():
            if "refused or failed" in str(row.get("canary", "")):
                b.append(p(f"**Canary answers refused or failed** ({row['config']}): {row['canary']}."))
        if images["soak"]:
            b.append(img(images["soak"], "soak windows against engine uptime"))
        for path in images.get("failures") or []:
            b.append(img(path, "every series of a flagged configuration, aligned, the onset marked"))
        if images["acc"]:
            b.append(img(images["acc"], "acceptance over time"))
        after = t["after_soak"]
        if not after.empty:
            b.append(h(3, "Before and after the soak"))
            acols = {
                "load": "open-loop load",
                "streams": "streams",
                "before_achieved_rps": "achieved rps before",
                "after_achieved_rps": "achieved rps after",
                "before_goodput_rps": "goodput rps before",
                "after_goodput_rps": "goodput rps after",
                "before_late": "late before",
                "after_late": "late after",
                "before_total_tps": "total t/s before",
                "after_total_tps": "total t/s after",
                "after_vs_before": "after / before",
                "ratio_metric": "ratio of",
                "ratio": "ratio (geometric)",
                "ratio_ci_low": "ratio 95% low",
                "ratio_ci_high": "ratio 95% high",
                "verdict": "verdict",
                "before_decode_tps": "decode t/s before",
                "after_decode_tps": "decode t/s after",
                "before_acceptance": "acceptance before",
                "after_acceptance": "acceptance after",
                "before_drafted_per_request": "drafted per request before",
                "after_drafted_per_request": "drafted per request after",
                "before_ttft_p50_s": "TTFT p50 s before",
                "after_ttft_p50_s": "TTFT p50 s after",
                "engine_uptime_h": "engine uptime h (after)",
            }
            b.append(table(_show(after, ["run"] * multi + ["config"] + list(acols), acols)))
            b.append(
                p(
                    "Before: the measurement phases on a fresh engine. After: the same phases on the engine that lived through",
                    "the soak, soak.after_repetitions times over with the prompts of the repetitions before. The ratio after to",
                    "before of the phases' median decode t/s (total t/s in open loop) has a 95% interval (Welch's two-sample t",
                    "on the logarithms, two repetitions or more on each side); 'degraded' means",
                    "the whole interval lies under 1: the engine aged, or the machine slowed (the soak windows and the",
                    "baseline's own row tell which). An open-loop phase is run again with its own schedule and prompts: the",
                    "same offered load, so achieved rps, goodput and late sends compare too.",
                )
            )

    b.append(h(2, "Losslessness"))
    vt = t["verify"]
    if vt.empty:
        b.append(
            p(
                "Not verified in these runs: `specsoak verify SCENARIO` compares each speculative configuration's greedy",
                "outputs with the baseline's, token by token.",
            )
        )
    else:
        cols = {
            "algorithm": "algorithm",
            "streams": "streams",
            "reference": "compared with",
            "method": "compared by",
            "prompts": "prompts",
            "identical": "identical",
            "diverged": "diverged",
            "drafted_tokens": "drafted tokens",
            "divergences": "first diverging token (prompt@index)",
            "verdict": "verdict",
        }
        b += [
            table(_show(vt, ["run"] * multi + ["config"] + list(cols), cols)),
            p(
                "Greedy decoding (temperature 0, fixed seed, no prompt cache). `tokens`: the engine's generated token ids compared one by",
                "one; `text`: the texts compared and the index is approximate. Synthetic configurations are never counted as lossless.",
            ),
        ]
    vd = t["verify_distribution"]
    if not vd.empty:
        cols = {
            "config": "configuration",
            "temperature": "temperature",
            "samples": "samples each",
            "categories": "categories",
            "statistic": "chi²",
            "dof": "dof",
            "p_value": "p-value",
            "verdict": "verdict",
        }
        b += [
            table(_show(vd, ["run"] * multi + list(cols), cols)),
            p(
                "Sampling at temperature > 0: the first two generated tokens of many samples, configuration against baseline,",
                "chi-square test of homogeneity (categories with an expected count below 5 pooled). A small p-value says the",
                "distributions differ; a large one only says this sample size could not tell them apart.",
            ),
        ]

    ks = t["k_sweep"]
    if not ks.empty or images["k"]:
        b.append(h(2, "K sweep"))
    if not ks.empty:
        counts = sorted(int(c.removeprefix("total_tps_")) for c in ks.columns if c.startswith("total_tps_"))
        cols = {
            "sweep": "sweep",
            "k": "K",
            "synthetic_length": "synthetic L",
            "acceptance": "acceptance",
            "mean_accept_len": "mean length",
            "solo_decode_tps": "solo decode t/s",
            **{f"total_tps_{n}": f"total t/s @{n}" for n in counts},
            "best_for": "best K for",
        }
        b += [
            table(_show(ks, ["run"] * multi + list(cols), cols)),
            p(
                "One configuration run at several draft lengths K. `best K for`: the columns where this K gave the highest throughput",
                "within its sweep (synthetic lengths are separate experiments). Seed 000: n_max 3 gave 86% acceptance, n_max 6 fell to 47%.",
            ),
        ]
    if images["k"]:
        b.append(img(images["k"], "K sweep"))
    pt = t["prompts"]
    if not pt.empty:
        # audit material: the table is prompts.csv (one line per phase, repetition and soak); here, its summary
        soaks = pt[pt["phase"] == "soak"] if "phase" in pt else pt.iloc[0:0]
        b += [
            h(2, "Prompts"),
            p(
                f"{len(pt) - len(soaks)} measured phases sent {int(pt['requests'].sum() - soaks['requests'].sum()):,} requests,",
                f"{int(pt['repeated'].sum() - soaks['repeated'].sum()):,} of them with a prompt already sent in the same phase"
                + (
                    f"; {len(soaks)} soaks sent {int(soaks['requests'].sum()):,} requests of {int(soaks['distinct_prompts'].sum()):,}"
                    f" distinct prompts ({int(soaks['repeated'].sum()):,} repeated)"
                    if len(soaks)
                    else ""
                )
                + ".",
                "One line per phase, repetition and soak: `prompts.csv` (scenario `prompt_reuse`: docs/scenarios.md).",
            ),
        ]
    notes = _notes(runs, t["verdict"])
    if notes:
        b += [h(2, "Notes"), ul(notes)]
    return b


def _show(df: pd.DataFrame, cols: list[str], names: dict[str, str]) -> pd.DataFrame:
    out = pd.DataFrame()
    for c in cols:
        if c in df:
            out[names.get(c, c)] = [_fmt(v) for v in df[c]]
    return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        v = float(v)
        a = abs(v)
        return (
            f"{v:,.0f}"
            if a >= 1000
            else f"{v:.1f}"
            if a >= 100
            else f"{v:.2f}"
            if a >= 1
            else f"{v:.3f}"
            if a > 0
            else "0"
        )
    return str(v)


def _g(v: Any) -> str:
    return f"{v:g}" if isnum(v) else "–"


def _max_streams(v: Any, lower_bound: Any) -> str:
    if not isnum(v):
        return "–"
    return ("≥" if str(lower_bound) == "True" else "") + f"{int(v)}"


def read_problems(runs: list[RunData]) -> list[str]:
    """What the report could not read, per run and file: skipped lines, the first one's number, why."""
    return [f"run {run.run_id}: {m}" for run in runs for m in run.read_log.messages(run.run_dir)]


def _notes(runs: list[RunData], table_: pd.DataFrame) -> list[str]:
    out: list[str] = [f"**Could not read** {m}: figures are computed without these lines." for m in read_problems(runs)]
    if (campaign := campaign_of(runs)) is not None:
        out += campaign_notes(campaign)
    cs = control_summary(runs, control_table(runs))
    for _, row in cs.iterrows() if not cs.empty else []:
        if row["drifted"]:
            out.append(
                f"**The machine's speed drifted** (run {row['run']}): the control {row['baseline']} spread "
                f"{row['control_spread']:.0%} over {row['blocks']} blocks ({row['control_min_tps']:.1f}–{row['control_max_tps']:.1f} "
                f"solo t/s), beyond the {row['drift_bound']:.0%} bound; ratios from the sequential design are suspect, "
                f"interleaved pairs share the drift."
            )
    for _, row in table_.iterrows():
        if isnum(row.get("records_missing")) and row["records_missing"] > 0:
            out.append(
                f"**{row['config']}**: its phases recorded {int(row['records_expected'])} requests; only "
                f"{int(row['records_expected'] - row['records_missing'])} request records could be read: its row is marked."
            )
        if isinstance(row.get("failure"), str) and row["failure"]:
            out.append(f"**{row['config']}** failed: {row['failure']}")
        if row.get("contaminated_phases"):
            out.append(
                f"**{row['config']}**: {int(row['contaminated_phases'])} phase(s) contaminated: other processes used up to "
                f"{row['other_cores_max']:.3f} cores while it was measured; treat its figures with care."
            )
        drafted, client = row.get("drafted_tokens"), row.get("client_drafted_tokens")
        if isnum(drafted) and isnum(client) and drafted != client:
            out.append(
                f"**{row['config']}**: engine counted {drafted:.0f} drafted tokens, responses summed to {client:.0f}."
            )
    for run in runs:
        hc = [c.get("harness_cores") for c in run.phases["cpu"]] if not run.phases.empty else []
        if hc:
            ec = [c.get("engine_cores") for c in run.phases["cpu"] if c.get("engine_cores") is not None]
            beside = f", beside the engine's median {pd.Series(ec).median():.2f} cores" if ec else ""
            out.append(
                f"Harness CPU during measurement (run {run.run_id}): median {pd.Series(hc).median():.3f} cores, max {max(hc):.3f}{beside}."
            )
        out += engine_log_notes(run.run_dir, run.run_id)
    return out
