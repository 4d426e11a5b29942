"""`specsoak report` at scale: synthesise an 8-hour, 1,000,000-request soak run folder and time
the report on it (wall time and peak RSS of the whole `specsoak report` process).

    python -m bench.report_scale                    # 1,000,000 requests into /tmp/specsoak-bench/scale-run
    python -m bench.report_scale --requests 100000  # a smaller one, to see how the figures grow

The folder is the quick run's fixture (tests/fixtures/run_quick: manifest, phases, requests,
capacity) plus an 8-hour soak of two configurations: slices, one-minute windows, verdicts,
and the request records as two Locust worker processes write them (soak/<slice>-<pid>.jsonl,
64 per-chunk ITLs each, 0.3% failures). Never committed: it is ~1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.measure import REPO

HOURS = 8.0
TOKENS = 64


def synthesise(out: Path, n_requests: int, seed: int = 7) -> Path:
    rnd = random.Random(seed)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(REPO / "tests" / "fixtures" / "run_quick", out)
    soak = out / "soak"
    soak.mkdir()
    manifest = json.loads((out / "manifest.json").read_text())
    t0 = float(manifest.get("stopped_unix") or time.time())
    duration = HOURS * 3600
    configs = ["baseline", "ngram-map-k"]
    slices = [f"{c}-s{i + 1:03d}" for i, c in enumerate(configs)]
    per_cfg = duration  # each configuration soaks 8 h (one slice each, one after the other)
    events = []
    for i, (c, s) in enumerate(zip(configs, slices, strict=True)):
        start = t0 + i * per_cfg
        events.append({"event": "start", "slice": s, "config": c, "t_unix": start, "offset_s": 0.0, "slice_s": per_cfg})
        events.append(
            {
                "event": "end",
                "slice": s,
                "config": c,
                "t_unix": start + per_cfg,
                "elapsed_s": per_cfg,
                "restarts": 0,
                "locust_stats": {"requests": n_requests // 2, "failures": 0},
                "record_files": [],
            }
        )
    (out / "soak_slices.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    windows = []
    for i, (c, s) in enumerate(zip(configs, slices, strict=True)):
        for w in range(int(per_cfg // 60)):
            a = t0 + i * per_cfg + w * 60
            windows.append(
                {
                    "config": c,
                    "slice": s,
                    "t_start_unix": a,
                    "t_end_unix": a + 60,
                    "t_unix": a + 30,
                    "requests": n_requests // 2 // int(per_cfg // 60),
                    "errors": 0,
                    "error_kinds": {},
                    "output_tokens": 0,
                    "decode_tps": 60 - w * 0.001,
                    "ttft_p95_s": 0.2,
                    "acceptance": 0.7 if c != "baseline" else None,
                    "mean_accept_len": 2.0 if c != "baseline" else None,
                    "engine_rss_mib": 300.0,
                }
            )
    (out / "windows.jsonl").write_text("".join(json.dumps(w) + "\n" for w in windows))
    (out / "verdicts.jsonl").write_text(
        json.dumps(
            {
                "t_unix": t0 + per_cfg + 3600,
                "config": "ngram-map-k",
                "slice": slices[1],
                "kind": "crash",
                "metric": None,
                "message": "synthetic",
                "evidence": {},
                "action": "restart",
            }
        )
        + "\n"
    )
    itl_pool = [",".join(f"{rnd.gauss(0.017, 0.002):.7f}" for _ in range(TOKENS - 1)) for _ in range(500)]
    for i, (c, s) in enumerate(zip(configs, slices, strict=True)):
        n = n_requests // len(configs)
        start0 = t0 + i * per_cfg
        for pid in (4101, 4102):
            seq = 0
            with open(soak / f"{s}-{pid}.jsonl", "w", encoding="utf-8", buffering=1 << 20) as f:
                for k in range(n // 2):
                    st = start0 + (k * 2 + (pid - 4101)) * per_cfg / n
                    ok = rnd.random() > 0.003
                    ttft = 0.05 + rnd.random() * 0.1
                    e2e = ttft + 0.017 * (TOKENS - 1)
                    status, kind, err = (
                        ("ok", None, None) if ok else ("error", "stall", "no chunk for 60 s after 12 chunks")
                    )
                    f.write(
                        f'{{"config":"{c}","phase":"soak","streams":4,"repetition":0,"stream":{k % 4},"index":{seq},'
                        f'"prompt_id":"soak-{k % 97}","status":"{status}","start_unix_s":{st:.6f},"ttft_s":{ttft:.6f},"e2e_s":{e2e:.6f},'
                        f'"output_tokens":{TOKENS},"chunks":{TOKENS},"prompt_tokens":{40 + k % 300},"decode_tps":{58 + rnd.random():.4f},'
                        f'"e2e_tps":{TOKENS / e2e:.4f},"itl_s":[{itl_pool[k % len(itl_pool)]}],"draft_tokens":null,"accepted_tokens":null,'
                        f'"finish_reason":"length","error_kind":{json.dumps(kind)},"error":{json.dumps(err)},"text":null,'
                        f'"id":"{s}/{pid}/{seq}","attempt":"{s}","turn":{k % 3}}}\n'
                    )
                    seq += 1
    manifest["soak"] = {"duration_s": per_cfg, "configurations": configs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def time_report(run: Path, out: Path) -> dict[str, float]:
    """Wall seconds and peak RSS (MiB) of `specsoak report RUN --out OUT`, a process of its own."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "report", str(run), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"specsoak report failed: {err}")
    return {"wall_s": wall, "peak_rss_mib": ru.ru_maxrss / 1024, "cpu_s": ru.ru_utime + ru.ru_stime}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/specsoak-bench/scale-run"))
    ap.add_argument("--reuse", action="store_true", help="keep an existing synthetic folder")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    if not (a.reuse and (a.dir / "manifest.json").exists()):
        t = time.perf_counter()
        synthesise(a.dir, a.requests)
        size = sum(f.stat().st_size for f in (a.dir / "soak").glob("*.jsonl"))
        print(
            f"synthesised {a.requests:,} soak requests ({size / 2**20:,.0f} MiB of JSONL) in {time.perf_counter() - t:.0f} s",
            flush=True,
        )
    shutil.rmtree(a.dir / "soak" / ".compact", ignore_errors=True)  # the first report compacts
    load = os.getloadavg()[0]
    first = {**time_report(a.dir, a.dir.parent / "scale-report"), "load": load}
    print(
        f"specsoak report, first (compacts to Parquet): {first['wall_s']:.1f} s wall, {first['cpu_s']:.1f} s CPU, "
        f"peak RSS {first['peak_rss_mib']:.0f} MiB (load average {load:.2f})",
        flush=True,
    )
    load = os.getloadavg()[0]
    again = {**time_report(a.dir, a.dir.parent / "scale-report"), "load": load}
    print(
        f"specsoak report, again (Parquet cache): {again['wall_s']:.1f} s wall, {again['cpu_s']:.1f} s CPU, "
        f"peak RSS {again['peak_rss_mib']:.0f} MiB (load average {load:.2f})",
        flush=True,
    )
    (a.dir.parent / f"report_scale-{a.requests}.json").write_text(
        json.dumps({"requests": a.requests, "first": first, "again": again})
    )
    if not a.no_doc:
        from bench.render import replace_section

        size = sum(f.stat().st_size for f in (a.dir / "soak").glob("*.jsonl"))
        md = (
            f"Synthetic run: {a.requests:,} soak requests over 2 × 8 h ({size / 2**20:,.0f} MiB of JSONL, 64 per-chunk ITLs each), "
            f"plus the quick run's phases. `specsoak report` as its own process:\n\n"
            "| report | wall s | CPU s | peak RSS MiB | load average at start |\n|---|---:|---:|---:|---:|\n"
            "| first: compacts soak/*.jsonl to Parquet, then reads it "
            f"| {first['wall_s']:.1f} | {first['cpu_s']:.1f} | {first['peak_rss_mib']:.0f} | {first['load']:.2f} |\n"
            "| again: Parquet cache (what a soak leaves, it compacts each slice as it ends) "
            f"| {again['wall_s']:.1f} | {again['cpu_s']:.1f} | {again['peak_rss_mib']:.0f} | {again['load']:.2f} |\n"
        )
        replace_section(REPO / "docs" / "performance.md", "report-at-scale", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
