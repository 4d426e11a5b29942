"""The verdict table (seed 000's layout plus acceptance and mean length), from run data alone.

Every column is defined once in docs/metrics.md; the names here carry their units.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd

from engines.types import EngineCounters, acceptance_figures
from harness.common.stats import median, ratio_interval, shown_difference
from harness.config.schema import load_label
from harness.records.types import ConfigState
from harness.report.load import RunData


def _sum(values: Any) -> float | None:
    s = pd.Series(values, dtype="float64").dropna()
    return float(s.sum()) if len(s) else None


def stream_counts(runs: list[RunData]) -> list[int]:
    counts: set[int] = set()
    for run in runs:
        if not run.phases.empty:
            counts.update(int(n) for n in run.phases["streams"].unique())
    return sorted(counts)


def arrival_loads(runs: list[RunData]) -> list[str]:
    """The open-loop phases' keys (``load``: '2rps', 'stages') of the runs, rates ascending, the stage list last."""
    keys: set[str] = set()
    for run in runs:
        ap = run.arrival_phases
        if not ap.empty and "load" in ap:
            keys.update(str(k) for k in ap["load"].dropna().unique())
    return sorted(keys, key=_load_order)


def _load_order(key: str) -> tuple[int, float, str]:
    try:
        return (0, float(key[:-3]), key) if key.endswith("rps") else (1, 0.0, key)
    except ValueError:
        return (1, 0.0, key)


def verdict_table(runs: list[RunData]) -> pd.DataFrame:
    """One row per (run, configuration); speedups against the run's first 'none' configuration. Closed-loop phases
    give the columns by stream count; open-loop phases (measurement.arrival) those by rate: offered, achieved and
    goodput requests per second, late sends (docs/metrics.md#open-loop-phases)."""
    rows: list[dict[str, Any]] = []
    counts = stream_counts(runs)
    loads = arrival_loads(runs)
    for run in runs:
        cfgs = run.manifest.configurations
        ph = run.phases
        ap = run.arrival_phases
        rq = run.requests
        run_rows: list[dict[str, Any]] = []
        for name in run.config_names:
            meta = cfgs.get(name) or ConfigState()
            p_closed = ph[ph["config"] == name] if not ph.empty else ph
            pa = ap[ap["config"] == name] if not ap.empty else ap
            # pooled figures (acceptance, CPU, agreement, records, failures) over every measured phase, open loop included
            p = (
                pd.concat([x for x in (p_closed, pa) if not x.empty], ignore_index=True)
                if not (p_closed.empty and pa.empty)
                else p_closed
            )
            r = rq[(rq["config"] == name) & (rq["phase"].isin(("measure", "arrivals")))] if not rq.empty else rq
            cap = run.capacity.get(name, {})
            row: dict[str, Any] = {
                "run": run.run_id,
                "engine": run.manifest.engine,
                "config": name,
                "algorithm": meta.get("algorithm"),
                "synthetic": bool(meta.get("synthetic")),
                "status": meta.get("status"),
            }
            solo_req = r[(r["phase"] == "measure") & (r["streams"] == 1) & (r["status"] == "ok")] if not r.empty else r
            row["solo_decode_tps"] = median(solo_req["decode_tps"]) if not solo_req.empty else None
            for n in counts:
                pn = p_closed[p_closed["streams"] == n] if not p_closed.empty else p_closed
                row[f"total_tps_{n}"] = median(pn["total_tps"]) if not pn.empty else None
                row[f"goodput_rps_{n}"] = median(pn["goodput_rps"]) if not pn.empty and "goodput_rps" in pn else None
            for key in loads:
                pk = pa[pa["load"] == key] if not pa.empty else pa
                for col in ("offered_rps", "achieved_rps", "goodput_rps"):
                    row[f"{col}_{key}"] = median(pk[col]) if not pk.empty and col in pk else None
                # not total_tps_{key}: that prefix is the closed-loop columns' (total_tps_N)
                row[f"arrival_total_tps_{key}"] = median(pk["total_tps"]) if not pk.empty else None
                row[f"late_{key}"] = _sum(pk["late"]) if not pk.empty and "late" in pk else None
                row[f"scheduled_{key}"] = _sum(pk["scheduled"]) if not pk.empty and "scheduled" in pk else None
                delays = pd.Series(
                    pk["max_send_delay_s"] if not pk.empty and "max_send_delay_s" in pk else [], dtype="float64"
                ).dropna()
                row[f"max_send_delay_s_{key}"] = float(delays.max()) if len(delays) else None
            if not p.empty:
                drafted = _sum(c.get("draft_tokens") for c in p["counters"])
                accepted = _sum(c.get("accepted_tokens") for c in p["counters"])
                steps = _sum(c.get("verify_steps") for c in p["counters"])
                pooled = acceptance_figures(
                    EngineCounters(draft_tokens=drafted, accepted_tokens=accepted, verify_steps=steps)
                )
                row["acceptance"], row["mean_accept_len"] = pooled["acceptance"], pooled["mean_accept_len"]
                row["drafted_tokens"] = drafted
                client = _sum(p["client_draft_tokens"]) if "client_draft_tokens" in p else None
                row["client_drafted_tokens"] = client
                row["contaminated_phases"] = int(p["contaminated"].sum())
                row["harness_cores"] = median([c.get("harness_cores") for c in p["cpu"]])
                row["other_cores_max"] = float(max(c.get("other_cores", 0.0) for c in p["cpu"]))
            else:
                row.update(
                    acceptance=None,
                    mean_accept_len=None,
                    drafted_tokens=None,
                    client_drafted_tokens=None,
                    contaminated_phases=0,
                    harness_cores=None,
                    other_cores_max=None,
                )
            row["engine_agreement"] = engine_agreement(
                p,
                int(
                    (meta.get("spec") or {}).get("max_tokens")
                    or run.scenario.get("measurement", {}).get("max_tokens")
                    or 0
                ),
            )
            row["soak"] = soak_verdict(meta.get("soak"))
            row["records_expected"], row["records_missing"] = _missing_records(p, r)
            row["requests_ok"] = int((r["status"] == "ok").sum()) if not r.empty else 0
            row["requests_failed"] = int((r["status"] != "ok").sum()) if not r.empty else 0
            row["slots"] = cap.get("slots")
            row["ctx_per_slot"] = cap.get("ctx_per_slot")
            row["ctx_total"] = cap.get("ctx_total")
            target = cap.get("target") or {}
            draft = cap.get("draft") or {}
            row["model_mib"] = _add(target.get("model_mib"), draft.get("model_mib"))
            row["kv_mib"] = _add(target.get("kv_mib"), draft.get("kv_mib"))
            row["compute_mib"] = _add(target.get("compute_mib"), draft.get("compute_mib"))
            row["memory_mib"] = _add(_add(row["model_mib"], row["kv_mib"]), row["compute_mib"])
            row["failure"] = meta.get("failure")
            run_rows.append(row)
        bases = {x["config"]: x for x in run_rows if x["algorithm"] == "none" and x["status"] == "done"}
        for row in run_rows:
            # compare with the baseline the configuration names, else the one serving the same target model; never
            # another model's (a run recorded before scenarios refused that gets no speedup rather than a wrong one)
            meta = cfgs.get(row["config"]) or ConfigState()
            named = (meta.get("spec") or {}).get("baseline")
            model = target_model(run, row["config"])
            base = (
                bases.get(named)
                if named
                else next(
                    (x for x in bases.values() if model is not None and target_model(run, x["config"]) == model), None
                )
            )
            row["baseline"] = base["config"] if base else None
            # each ratio from the pairs (repetition r of the configuration and of its baseline: in the interleaved
            # design, the same block, seconds apart): their geometric mean and its interval; the ratio of the
            # medians only where no repetition pairs up
            solo_ratios = _rep_ratios(solo_by_rep(rq, row["config"]), solo_by_rep(rq, base["config"])) if base else []
            centre, row["solo_speedup_ci_low"], row["solo_speedup_ci_high"] = ratio_interval(solo_ratios)
            row["solo_speedup"] = (
                centre
                if centre is not None
                else _ratio(row["solo_decode_tps"], base["solo_decode_tps"])
                if base
                else None
            )
            row["solo_speedup_reps"] = len(solo_ratios)
            for n in counts:
                ratios = (
                    _rep_ratios(_tps_by_rep(ph, row["config"], n), _tps_by_rep(ph, base["config"], n)) if base else []
                )
                centre, row[f"speedup_{n}_ci_low"], row[f"speedup_{n}_ci_high"] = ratio_interval(ratios)
                row[f"speedup_{n}"] = (
                    centre
                    if centre is not None
                    else _ratio(row.get(f"total_tps_{n}"), base.get(f"total_tps_{n}"))
                    if base
                    else None
                )
                row[f"speedup_{n}_reps"] = len(ratios)
            row["memory_vs_baseline"] = _ratio(row["memory_mib"], base["memory_mib"]) if base else None
        rows.extend(run_rows)
    return pd.DataFrame(rows)


AGREEMENT_TOLERANCE = 0.005  # client and engine counts within 0.5% agree


def engine_agreement(p: pd.DataFrame, max_tokens: int) -> str:
    """The client's counts against the engine's counters over the configuration's measured phases: output,
    drafted and accepted tokens. '✓' within 0.5%; '✗ what: engine E vs client C' otherwise, with a word on
    why (another client used the engine when it counted more than the client sent and no request failed).
    A failed request's tokens reach only the engine's count: up to max_tokens each is allowed for them."""
    if p.empty:
        return "–"
    failed = int(pd.Series(p.get("errors", []), dtype="float64").fillna(0).sum())
    pairs = [("output", _sum(c.get("output_tokens") for c in p["counters"]), _sum(p.get("output_tokens", [])))]
    if "client_draft_tokens" in p:
        pairs.append(("drafted", _sum(c.get("draft_tokens") for c in p["counters"]), _sum(p["client_draft_tokens"])))
    if "client_accepted_tokens" in p:
        pairs.append(
            ("accepted", _sum(c.get("accepted_tokens") for c in p["counters"]), _sum(p["client_accepted_tokens"]))
        )
    checked, bad = 0, []
    for what, engine, client in pairs:
        if engine is None or client is None:
            continue
        checked += 1
        slack = failed * max_tokens if what == "output" else 0.0
        if abs(engine - client) <= AGREEMENT_TOLERANCE * max(engine, client, 1.0) or 0 <= engine - client <= slack:
            continue
        why = " (another client used the engine?)" if engine > client and not failed else ""
        bad.append(f"{what}: engine {engine:,.0f} vs client {client:,.0f}{why}")
    if not checked:
        return "–"
    return ("✗ " + "; ".join(bad)) if bad else ("✓" + (f" ({failed} failed)" if failed else ""))


def target_model(run: RunData, config: str) -> str | None:
    """The configuration's target model as the manifest recorded it (runs recorded before it was kept per
    configuration: the configuration's own ``model``, else the scenario's server model)."""
    meta = run.manifest.configurations.get(config) or ConfigState()
    if meta.model:
        return str(meta.model)
    return meta.spec.get("model") or ((run.scenario.get("server") or {}).get("model"))


def _missing_records(p: pd.DataFrame, r: pd.DataFrame) -> tuple[int, int]:
    """(requests the configuration's phases recorded, how many of them have no readable request record)."""
    if p.empty or "requests" not in p:
        return 0, 0
    expected = int(pd.Series(p["requests"], dtype="float64").fillna(0).sum())
    if "attempt" in p and not r.empty and "attempt" in r:
        have = r["attempt"].value_counts()
        missing = sum(
            max(0, int(n) - int(have.get(a, 0)))
            for a, n in zip(p["attempt"], p["requests"], strict=True)
            if isinstance(a, str)
        )
    else:
        missing = max(0, expected - len(r))
    return expected, int(missing)


def _tps_by_rep(ph: pd.DataFrame, config: str, n: int) -> dict[int, float]:
    """Total t/s of each repetition at N streams (the last record of a repetition measured twice)."""
    if ph.empty:
        return {}
    p = ph[(ph["config"] == config) & (ph["streams"] == n)]
    return {int(r): float(t) for r, t in zip(p["repetition"], p["total_tps"], strict=True)}


def solo_by_rep(rq: pd.DataFrame, config: str) -> dict[int, float]:
    """Median decode t/s of each repetition's successful requests at 1 stream."""
    if rq.empty:
        return {}
    r = rq[(rq["config"] == config) & (rq["phase"] == "measure") & (rq["streams"] == 1) & (rq["status"] == "ok")]
    out: dict[int, float] = {}
    for rep, grp in r.groupby("repetition", sort=True):
        m = median(grp["decode_tps"])
        if m is not None:
            out[int(cast("int", rep))] = m
    return out


def _rep_ratios(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """Per-repetition ratios a/b over the repetitions both have (repetition r of both is paired)."""
    return [a[r] / b[r] for r in sorted(a) if b.get(r)]


def _add(a: float | None, b: float | None) -> float | None:
    if a is None and b is None:
        return None
    return (a or 0.0) + (b or 0.0)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or (isinstance(b, float) and math.isnan(b)):
        return None
    return a / b


def display_table(df: pd.DataFrame, counts: list[int], multi_run: bool) -> pd.DataFrame:
    """The verdict as people read it: labels, units, synthetic rows marked."""
    out = pd.DataFrame()
    if multi_run:
        out["run"] = df["run"]
        if "engine" in df and df["engine"].nunique() > 1:  # runs of several engines: say which row is which
            out["engine"] = df["engine"]
    out["configuration"] = [f"{c} [synthetic]" if s else c for c, s in zip(df["config"], df["synthetic"], strict=True)]
    out["algorithm"] = df["algorithm"]
    loads = [
        c[len("achieved_rps_") :] for c in df.columns if c.startswith("achieved_rps_")
    ]  # open-loop phases, in order
    itself = [
        c == b for c, b in zip(df["config"], df.get("baseline", [None] * len(df)), strict=True)
    ]  # a baseline's own row
    if counts or not loads:  # a run of open-loop phases only has no solo figure
        out["solo decode t/s"] = df["solo_decode_tps"].map(_fmt1)
        out["solo vs baseline [95% CI]"] = [
            "(baseline)" if me else _fmtci(v, lo, hi)
            for me, v, lo, hi in zip(
                itself, df["solo_speedup"], df["solo_speedup_ci_low"], df["solo_speedup_ci_high"], strict=True
            )
        ]
    for n in counts:
        out[f"total t/s @{n}"] = df[f"total_tps_{n}"].map(_fmt1)
        out[f"@{n} vs baseline [95% CI]"] = [
            "(baseline)" if me else _fmtci(v, lo, hi)
            for me, v, lo, hi in zip(
                itself, df[f"speedup_{n}"], df[f"speedup_{n}_ci_low"], df[f"speedup_{n}_ci_high"], strict=True
            )
        ]
    for key in loads:
        label = load_label(key)
        out[f"offered / achieved rps {label}"] = [
            f"{_fmt2(o)} / {_fmt2(a)}" for o, a in zip(df[f"offered_rps_{key}"], df[f"achieved_rps_{key}"], strict=True)
        ]
        out[f"goodput rps {label}"] = df[f"goodput_rps_{key}"].map(_fmt2)
        out[f"late {label}"] = [
            _late(n, of, d)
            for n, of, d in zip(df[f"late_{key}"], df[f"scheduled_{key}"], df[f"max_send_delay_s_{key}"], strict=True)
        ]
    out["acceptance"] = df["acceptance"].map(_fmt2)
    out["mean length"] = df["mean_accept_len"].map(_fmt2)
    out["ctx/slot"] = df["ctx_per_slot"].map(_fmt0)
    out["ctx total"] = df["ctx_total"].map(_fmt0)
    if "servable_ctx_per_slot" in df and df["servable_ctx_per_slot"].map(_present).any():
        # under the scenario's memory budget (the memory table), marked ✓ when the fill check proved it
        out["servable ctx/slot (budget)"] = [
            _fmt0(v) + (" ✓" if f == "ok" else " ✗" if f in ("failed", "engine_failed") else "")
            for v, f in zip(df["servable_ctx_per_slot"], df.get("fill_check", [None] * len(df)), strict=True)
        ]
    out["slots"] = df["slots"].map(_fmt0)
    out["memory MiB"] = df["memory_mib"].map(_fmt0)
    out["failures"] = [
        _failures(ok, failed, f)
        for ok, failed, f in zip(df["requests_ok"], df["requests_failed"], df["failure"], strict=True)
    ]
    if "engine_agreement" in df:
        out["engine agreement"] = df["engine_agreement"].fillna("–")
    if "records_missing" in df and (df["records_missing"].fillna(0) > 0).any():
        out["request records read"] = [
            f"✗ {int(e - m)} of {int(e)}" if m else "all"
            for e, m in zip(df["records_expected"], df["records_missing"].fillna(0), strict=True)
        ]
    if "soak" in df and df["soak"].map(lambda v: isinstance(v, str) and v != "").any():
        out["soak"] = df["soak"].map(lambda v: v if isinstance(v, str) and v else "–")
    # where the figures come from, once they come from more than one machine (a campaign's parts, docs/fleet.md)
    places = {v for col in ("measured_on", "soaked_on") if col in df for v in df[col] if isinstance(v, str)}
    if len(places) > 1 or "soaked_on" in df:
        out["measured on"] = df.get("measured_on", "–")
        if "soaked_on" in df:
            out["soaked on"] = df["soaked_on"].map(lambda v: v if isinstance(v, str) else "–")
    return out


def soak_verdict(soak: dict[str, Any] | None) -> str:
    """The configuration's soak in one cell: how long it ran, or what ended it at which engine uptime."""
    if not soak:
        return ""
    hours = f"{float(soak.get('soak_s') or 0) / 3600:.2f} h"
    first = soak.get("first_failure")
    if soak.get("status") != "failed":
        # an "ok" says how much of the soak was judged (absent in a manifest written before it was counted)
        seen = soak.get("windows")
        judged = f", {soak.get('judged_windows', 0)}/{seen} windows judged" if isinstance(seen, int) else ""
        over = soak.get("overloads") or []
        return f"ok ({hours}{judged})" + (f"; overloaded at {over[0]}" if over else "")
    if not first:
        return f"✗ {soak.get('stopped_by') or 'failed'} ({hours})"
    up = first.get("engine_uptime_s")
    what = f"{first.get('kind')}" + (f" of {first['metric']}" if first.get("metric") else "")
    return f"✗ {what} at {float(up) / 3600:.2f} h engine uptime" if up is not None else f"✗ {what}"


def _late(late: Any, scheduled: Any, max_delay: Any) -> str:
    """Late sends of an open-loop load, over its repetitions: 'L/S (max D s)', '0/S', or '–' when not measured."""
    if not (_present(late) and _present(scheduled)):
        return "–"
    return f"{late:,.0f}/{scheduled:,.0f}" + (f" (max {max_delay:.2f} s)" if late and _present(max_delay) else "")


def _failures(ok: int, failed: int, failure: Any) -> str:
    if isinstance(failure, str) and failure:
        return "config failed"
    return f"{failed}/{ok + failed}" if failed else "0"


def _present(v: Any) -> bool:
    """Not None and not NaN (any type; compare harness.common.stats.isnum: a real number only)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _fmt0(v: Any) -> str:
    return f"{v:,.0f}" if _present(v) else "–"


def _fmt1(v: Any) -> str:
    return f"{v:.1f}" if _present(v) else "–"


def _fmt2(v: Any) -> str:
    return f"{v:.2f}" if _present(v) else "–"


def _fmtx(v: Any) -> str:
    return f"{v:.2f}×" if _present(v) else "–"


def _fmtci(v: Any, lo: Any, hi: Any) -> str:
    if not _present(v):
        return "–"
    if not (_present(lo) and _present(hi)):
        return f"{v:.2f}× [–]"
    straddles = shown_difference(lo, hi) == "no difference shown"
    return f"{v:.2f}× [{lo:.2f}, {hi:.2f}]" + (" no difference shown" if straddles else "")
