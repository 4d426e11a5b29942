"""Another process taking a share of one core, for a bounded time: the contaminated soak of issue #33.

    python -m bench.cpu_taker --cores 0.33 --seconds 2400

It spins while its own CPU time is behind ``cores`` x the time elapsed and sleeps a short period otherwise, so a
machine that preempts it is caught up with rather than given less (its mean over any minute stays near ``cores``).
The soak measures it independently: each window's ``cpu.other_cores`` (harness/probe/cpu.py). It prints its PID on
start and, on exit (the time is up, SIGTERM or Ctrl-C), one JSON line: the CPU seconds it took over the wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def take(cores: float, seconds: float, period_s: float = 0.01) -> dict[str, float]:
    """Take ``cores`` of one core for ``seconds`` (or until SIGTERM); returns what it took."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    t0, c0 = time.monotonic(), time.process_time()
    try:
        while not stop:
            elapsed = time.monotonic() - t0
            if elapsed >= seconds:
                break
            if time.process_time() - c0 < cores * elapsed:
                end = time.monotonic() + period_s * cores  # a slice of spinning, then look again
                while time.monotonic() < end:
                    pass
            else:
                time.sleep(period_s)
    except KeyboardInterrupt:
        pass
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    return {"cores_asked": cores, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores": round(cpu / wall, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=float, default=0.33, help="share of one core to take (0 < cores <= 1)")
    ap.add_argument("--seconds", type=float, required=True, help="how long; it ends by itself after that")
    args = ap.parse_args(argv)
    if not 0 < args.cores <= 1:
        ap.error(f"--cores {args.cores}: a share of one core, 0 < cores <= 1")
    if args.seconds <= 0:
        ap.error(f"--seconds {args.seconds}: must be > 0")
    print(f"cpu_taker: pid {os.getpid()}, {args.cores:g} cores for {args.seconds:g} s", file=sys.stderr, flush=True)
    print(json.dumps(take(args.cores, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
