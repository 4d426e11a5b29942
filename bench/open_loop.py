"""Open-loop clients against the same fake server at the same constant rates: the harness's open-loop client
(``harness.load.arrivals.run_arrivals``, bench/harness_arrivals.py) against the peers' own rate modes: Locust's
``constant_pacing`` user (bench/locust_pacing.py), GuideLLM's ``constant`` profile, AIPerf's ``--request-rate`` with
``--arrival-pattern constant``.

    python -m bench.open_loop                 # or: make bench   (peers go into .venv-bench)
    python -m bench.open_loop --quick --clients harness,locust

Every figure comes from the fake server's own log (bench/fake_server.py: when each request arrived), the same for
every client: **achieved rate** (arrivals − 1 over first to last arrival), **send-time error** (each arrival against
the ideal constant schedule, the i-th at anchor + i / R with the anchor the median of arrival i − i / R: p50 and p99
of the absolute difference, ms; a client that drifts or falls behind shows it, one slow first connection does not),
**late share** (arrivals more than 10 ms behind their ideal time, harness.load.schedule.LATE_AFTER_S),
the gaps' coefficient of variation (0 for a perfect constant rate), and the client's CPU. The harness's own count
of late sends (its records) is shown beside the server's. Writes docs/performance.md's ``open-loop`` section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import peers
from bench.measure import REPO, Level, Result, ServerLog, measure, read_records
from harness.load.schedule import LATE_AFTER_S

# rate -> seconds of schedule; answers: 32 tokens, first after 50 ms, then every 10 ms (~0.36 s each)
RATES = {5.0: 12.0, 20.0: 8.0, 50.0: 6.0}
QUICK = {5.0: 3.0, 20.0: 2.0, 50.0: 2.0}
MAX_TOKENS, TTFT_MS, ITL_MS = 32, 50.0, 10.0
CLIENTS = ("harness", "locust", "guidellm", "aiperf")


def _level(rate: float, seconds: float) -> Level:
    n = max(2, round(rate * seconds))
    return Level(
        streams=math.ceil(rate * 0.5) + 1,
        requests=n,
        max_tokens=MAX_TOKENS,
        ttft_ms=TTFT_MS,
        itl_ms=ITL_MS,
        stall_every=0,
    )


def send_figures(slog: ServerLog, rate: float) -> dict[str, Any]:
    """Arrival times at the server against the ideal constant schedule (i / rate after an anchor: the median offset)."""
    recv = np.sort(np.array([r["recv_ns"] for r in slog.requests], dtype=np.int64)) / 1e9
    if recv.size < 2:
        return {"arrivals": int(recv.size)}
    # anchored at the median offset, not at the first arrival: one slow first connection would shift every other
    grid = np.arange(recv.size) / rate
    ideal = float(np.median(recv - grid)) + grid
    err = recv - ideal
    gaps = np.diff(recv)
    return {
        "arrivals": int(recv.size),
        "achieved_rps": float((recv.size - 1) / (recv[-1] - recv[0])) if recv[-1] > recv[0] else None,
        "send_err_p50_ms": float(np.percentile(np.abs(err), 50) * 1e3),
        "send_err_p99_ms": float(np.percentile(np.abs(err), 99) * 1e3),
        "late_share": float(np.mean(err > LATE_AFTER_S)),
        "gap_cv": float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None,
    }


def run_harness(rate: float, level: Level, work: Path) -> tuple[Result, ServerLog | None]:
    records = work / "requests.jsonl"

    def cmd(url: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.harness_arrivals",
            "--url",
            url,
            "--rate",
            str(rate),
            "--requests",
            str(level.requests),
            "--max-tokens",
            str(level.max_tokens),
            "--records",
            str(records),
        ]

    res, slog = measure("harness open loop (run_arrivals)", level, work, cmd, timeout_s=level.requests / rate + 120)
    recs = read_records([records]) if records.exists() else []
    res.failed = sum(1 for r in recs if r.get("status") != "ok")
    res.extra["own_late"] = sum(1 for r in recs if r.get("late"))
    return res, slog


def run_locust(rate: float, level: Level, work: Path) -> tuple[Result, ServerLog | None]:
    users = level.streams * 2  # each user's pacing (users / rate) leaves room for its ~0.36 s answer
    # spawned at R users per second, so the users' own grids interleave into one of period 1 / R (spawned all at
    # once, each user's first request goes out at its spawn: U requests at once, then again every U / R s)
    duration = level.requests / rate + users / rate

    def cmd(url: str) -> list[str]:
        return [
            str(Path(sys.executable).parent / "locust"),
            "-f",
            str(REPO / "bench" / "locust_pacing.py"),
            "--headless",
            "-u",
            str(users),
            "-r",
            f"{rate:g}",
            "-t",
            f"{math.ceil(duration)}s",
            "--stop-timeout",
            "5",
            "--host",
            url,
            "--only-summary",
            "--loglevel",
            "WARNING",
        ]

    res, slog = measure(
        f"Locust constant_pacing ({users} users)",
        level,
        work,
        cmd,
        timeout_s=duration + 90,
        env={"BENCH_PACING_S": f"{users / rate:.6f}", "BENCH_MAX_TOKENS": str(level.max_tokens)},
    )
    return res, slog


def run_guidellm(rate: float, level: Level, work: Path) -> tuple[Result, ServerLog | None]:
    out = work / "guidellm.json"
    cmd = peers.guidellm_command({"kind": "constant", "rate": rate}, level, work, out)
    return measure(
        "GuideLLM 0.8.1 constant", level, work, cmd, timeout_s=level.requests / rate + 150, env={"HF_HUB_OFFLINE": "1"}
    )


def run_aiperf(rate: float, level: Level, work: Path) -> tuple[Result, ServerLog | None]:
    load = ["--request-rate", str(rate), "--arrival-pattern", "constant"]
    cmd = peers.aiperf_command(load, level, work / "artifacts")
    return measure("AIPerf 0.13.0 --request-rate constant", level, work, cmd, timeout_s=level.requests / rate + 180)


RUNNERS = {"harness": run_harness, "locust": run_locust, "guidellm": run_guidellm, "aiperf": run_aiperf}


def render(rows: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    def f(x: Any, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, (int, float)) and x == x else "–"

    lines = [
        "| client | rate rps | requests | achieved rps (server) | send-time error p50 / p99 ms | late share (> 10 ms) | gap CV | "
        "client's own late count | client CPU s | failed | other cores | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines.extend(
        f"| {r['client']} | {r['rate_rps']:g} | {r.get('arrivals', 0)} | {f(r.get('achieved_rps'), '.2f')} | "
        f"{f(r.get('send_err_p50_ms'), '.1f')} / {f(r.get('send_err_p99_ms'), '.1f')} | {f(r.get('late_share'), '.0%')} | "
        f"{f(r.get('gap_cv'), '.3f')} | {r.get('own_late', '–')} | {f(r.get('client_cpu_s'), '.2f')} | "
        f"{r.get('failed') if r.get('failed') is not None else '–'} | {f(r.get('other_cores'), '.2f')}"
        f"{' (contaminated)' if r.get('contaminated') else ''} | {r.get('note') or ''} |"
        for r in sorted(rows, key=lambda r: (r["rate_rps"], r["client"]))
    )
    lines += [f"\nSkipped: {c}: {why}" for c, why in skipped.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default=",".join(CLIENTS), help=f"any of {', '.join(CLIENTS)}")
    ap.add_argument("--rates", default=None, help="comma-separated rates (default: 5,20,50)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specsoak-bench/open_loop"))
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "performance.md")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--peer-venv", type=Path, default=REPO / ".venv-bench")
    a = ap.parse_args(argv)
    table = QUICK if a.quick else RATES
    rates = [float(x) for x in a.rates.split(",")] if a.rates else list(table)
    peers.PEER_VENV = a.peer_venv
    clients = [c for c in a.clients.split(",") if c]
    skipped = {c: why for c in clients if (why := peers.unavailable(c))}
    for c, why in skipped.items():
        print(f"SKIPPED {c}: {why}", flush=True)
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    for rate in rates:
        level = _level(rate, table.get(rate, 4.0))
        for client in clients:
            if client in skipped:
                continue
            t = time.monotonic()
            try:
                res, slog = RUNNERS[client](rate, level, a.work / f"{client}-{rate:g}")
                row: dict[str, Any] = {
                    "client": res.client,
                    "rate_rps": rate,
                    "client_cpu_s": res.client_cpu_s,
                    "failed": res.failed,
                    "other_cores": res.other_cores,
                    "contaminated": res.contaminated,
                    "note": res.note,
                    "exit_code": res.exit_code,
                    "scheduled": level.requests,
                    **res.extra,
                }
                row.update(send_figures(slog, rate) if slog is not None else {"arrivals": 0})
            except Exception as exc:
                row = {"client": client, "rate_rps": rate, "note": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(
                f"{row['client']:<44} @{rate:g} rps: achieved {row.get('achieved_rps') or 0:.2f}, send err p50/p99 "
                f"{row.get('send_err_p50_ms') or 0:.1f}/{row.get('send_err_p99_ms') or 0:.1f} ms, late {row.get('late_share') or 0:.0%}, "
                f"arrivals {row.get('arrivals')}/{level.requests}, other {row.get('other_cores') or 0:.2f} cores "
                f"{row.get('note') or ''} [{time.monotonic() - t:.0f} s]",
                flush=True,
            )
    data = {"load_avg": list(os.getloadavg()), "quick": a.quick, "rates": rates, "skipped": skipped, "results": rows}
    (a.work / "results.json").write_text(json.dumps(data, indent=1, default=str))
    md = render(rows, skipped)
    print("\n" + md)
    if not a.no_doc:
        from bench.render import replace_section

        replace_section(a.doc, "open-loop", md)
        print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
