"""Client overhead and timing accuracy: the harness's client, its Locust path, and peer clients,
all against the same fake server (bench/fake_server.py), interleaved per concurrency level.

    python -m bench.client_overhead            # or: make bench   (peers go into .venv-bench)
    python -m bench.client_overhead --quick --clients harness,locust

Per client and concurrency: client CPU seconds per 1,000 tokens (whole process tree, start-up
included), client cores while the run is in progress, peak RSS of the tree, achieved streams
(the server's own count of concurrent streams), failed requests, and timing error against the
server's send log (median and p99). Writes docs/performance.md's generated part
(``--doc``), docs/client_overhead.png and the raw figures (``--work``/results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import peers
from bench.measure import REPO, Level, Result, ServerLog, chunk_errors, measure, quantile_errors, read_records

# (streams, requests, max_tokens, ttft_ms, itl_ms): the token rate each server has to emit stays
# within what one Python process emits on a shared 2-core box (about 3,000 chunks/s)
LEVELS = {
    1: Level(1, 8, 128, 50, 10),
    16: Level(16, 64, 128, 50, 10),
    64: Level(64, 128, 128, 50, 20),
    256: Level(256, 256, 64, 100, 100),
    1024: Level(1024, 1024, 32, 200, 400),
}
QUICK = {
    1: Level(1, 2, 32, 20, 10),
    16: Level(16, 16, 32, 20, 10),
    64: Level(64, 64, 32, 20, 20),
    256: Level(256, 256, 16, 50, 100),
    1024: Level(1024, 1024, 8, 100, 400),
}
CLIENTS = ("harness", "harness-fsync", "locust", "guidellm", "aiperf", "vllm")
DEFAULT_CLIENTS = ("harness", "locust", "guidellm", "aiperf", "vllm")


def run_harness(level: Level, work: Path, fsync_each: bool = False) -> Result:
    records = work / "requests.jsonl"

    def cmd(url: str) -> list[str]:
        c = [
            sys.executable,
            "-m",
            "bench.harness_client",
            "--url",
            url,
            "--streams",
            str(level.streams),
            "--requests",
            str(level.requests),
            "--max-tokens",
            str(level.max_tokens),
            "--records",
            str(records),
        ]
        return c + (["--per-record-fsync"] if fsync_each else [])

    res, slog = measure(
        "harness (per-record fsync)" if fsync_each else "harness",
        level,
        work,
        cmd,
        timeout_s=level.expected_s * 4 + 120,
    )
    recs = read_records([records])
    _from_records(res, slog, recs)
    return res


def run_locust(level: Level, work: Path) -> Result:
    records_dir = work / "locust"
    workers = 2 if level.streams >= 64 else 0
    per_req = level.expected_s / max(1, level.requests // level.streams)
    duration = max(2.0, level.expected_s - per_req * 0.5)

    def cmd(url: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.locust_client",
            "--url",
            url,
            "--users",
            str(level.streams),
            "--duration-s",
            f"{duration:.1f}",
            "--stop-timeout-s",
            str(int(per_req * 1.5 + 5)),
            "--max-tokens",
            str(level.max_tokens),
            "--workers",
            str(workers),
            "--records-dir",
            str(records_dir),
        ]

    name = f"harness via Locust ({'master + 2 workers' if workers else 'local'})"
    res, slog = measure(name, level, work, cmd, timeout_s=duration + per_req * 2 + 120)
    recs = read_records(sorted(records_dir.glob("bench-*.jsonl")))
    _from_records(res, slog, recs)
    return res


def _from_records(res: Result, slog: ServerLog | None, recs: list[dict[str, Any]]) -> None:
    res.failed = sum(1 for r in recs if r.get("status") != "ok")
    res.extra["records"] = len(recs)
    if slog is None:
        return
    ok = [r for r in recs if r.get("status") == "ok"]
    ttft = np.array([r["ttft_s"] * 1e3 for r in ok if r.get("ttft_s") is not None])
    itl = np.array([x * 1e3 for r in ok for x in (r.get("itl_s") or [])])
    quantile_errors(res, slog, ttft, itl, "per chunk")
    chunk_errors(res, slog, ok)


RUNNERS: dict[str, Callable[[Level, Path], Result]] = {
    "harness": run_harness,
    "harness-fsync": lambda level, work: run_harness(level, work, fsync_each=True),
    "locust": run_locust,
    "guidellm": peers.run_guidellm,
    "aiperf": peers.run_aiperf,
    "vllm": peers.run_vllm,
}


def quiet_report() -> dict[str, Any]:
    """Load average and the other engineers' heavy processes at the start of the benchmark."""
    out = subprocess.run(
        ["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[1:]
    mine = os.getpid()
    busy = [
        line.strip()[:160]
        for line in out
        if ("llama-server" in line or "pytest" in line) and str(mine) not in line.split()[0]
    ]
    return {"load_avg": list(os.getloadavg()), "busy_processes": busy[:10]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,16,64,256,1024")
    ap.add_argument("--clients", default=",".join(DEFAULT_CLIENTS), help=f"any of {', '.join(CLIENTS)}")
    ap.add_argument("--quick", action="store_true", help="tiny request counts, for development")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specsoak-bench/client_overhead"))
    ap.add_argument(
        "--doc",
        type=Path,
        default=REPO / "docs" / "performance.md",
        help="the page whose generated section is replaced",
    )
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--peer-venv", type=Path, default=REPO / ".venv-bench")
    ap.add_argument(
        "--merge-with", type=Path, help="an earlier results.json: its rows stay, except those measured again now"
    )
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",") if x]
    clients = [c for c in a.clients.split(",") if c]
    table = QUICK if a.quick else LEVELS
    peers.PEER_VENV = a.peer_venv
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    env = quiet_report()
    print(f"load average {env['load_avg'][0]:.2f}; other heavy processes: {len(env['busy_processes'])}", flush=True)
    for line in env["busy_processes"]:
        print(f"  busy: {line}", flush=True)
    results: list[Result] = []
    skipped: dict[str, str] = {}
    for client in clients:
        why = peers.unavailable(client)
        if why:
            skipped[client] = why
            print(f"SKIPPED {client}: {why}", flush=True)
    for n in levels:
        level = table[n]
        for client in clients:
            if client in skipped:
                continue
            t = time.monotonic()
            try:
                res = RUNNERS[client](level, a.work / f"{client}-{n}")
            except Exception as exc:
                res = Result(client, n, note=f"{type(exc).__name__}: {exc}"[:300])
            results.append(res)
            print(_line(res) + f"  [{time.monotonic() - t:.0f} s]", flush=True)
    data = {
        "env": env,
        "quick": a.quick,
        "levels": {n: table[n].__dict__ for n in levels},
        "skipped": skipped,
        "results": [r.to_dict() for r in results],
    }
    if a.merge_with:
        old = json.loads(a.merge_with.read_text())
        again = {(r["client"], r["streams"]) for r in data["results"]}
        data["results"] = [r for r in old["results"] if (r["client"], r["streams"]) not in again] + data["results"]
        data["levels"] = {**old["levels"], **{str(k): v for k, v in data["levels"].items()}}
        data["skipped"] = {**old.get("skipped", {}), **skipped}
        data["env"] = {**old["env"], "remeasured": {"clients": clients, "levels": levels, **env}}
    (a.work / "results.json").write_text(json.dumps(data, indent=1, default=str))
    from bench.render import render_client_overhead

    md, png = render_client_overhead(data, REPO / "docs" / "client_overhead.png")
    print("\n" + md)
    if not a.no_doc:
        from bench.render import replace_section

        replace_section(a.doc, "client-overhead", md)
        print(f"wrote {a.doc} and {png}")
    return 0


def _line(r: Result) -> str:
    f = r.to_dict()

    def g(x: Any, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, (int, float)) else "–"

    return (
        f"{r.client:<36} @{r.streams:<5} cpu/1k tok {g(f['cpu_s_per_1k_tokens'], '.3f')} s, cores {g(f['client_cores'], '.3f')}, "
        f"RSS {r.peak_rss_mib:.0f} MiB, streams {r.achieved_streams}, tokens {r.tokens}, failed {r.failed if r.failed is not None else '?'}, "
        f"ITL err p50/p99 {g(r.itl_err_p50_ms, '.2f')}/{g(r.itl_err_p99_ms, '.2f')} ms, chunk err p99 {g(r.chunk_err_p99_ms, '.2f')} ms, "
        f"other {r.other_cores:.2f} cores{' CONTAMINATED' if r.contaminated else ''}{' ' + r.note if r.note else ''}"
    )


if __name__ == "__main__":
    sys.exit(main())
