"""The shapes engines' trackers report after hours, simulated window by window through the watchdog's own pure
functions: how soon each is flagged, with what, and what it says moved with it.

    .venv/bin/python -m bench.shapes              # the table in docs/detector.md#field-shapes (a few seconds)

Shapes (issue #24; 60-s windows, 3% multiplicative noise, seeds 0..N-1):

- gc_pauses: a pause once every 5 min growing linearly with uptime, 7 s at 1 h to 46 s at 6.5 h (SGLang PR #28067:
  a 20-s health check killed the pod at ~46 s). The watchdog's stall floor is 5 s (harness/soak_figures.stall_to_flag).
- acceptance_decay: acceptance 0.58 -> 0.225 (accept length 3.33 -> 1.90 at K=4) linearly over 2 h after 1 h flat, KV
  usage 0.36 -> 0.47 with it, no errors (SGLang #28771). The change detector (harness/detect/changepoint.py) and the
  explanation (harness/soak/explain.py).
- leak_then_latency: RSS +90 B per request at 150 rps (+46 MiB/h) on 4 GiB for 12 h, TTFT p95 x3 from hour 7 (vLLM
  #44175). The memory forecast must not cry wolf at 20 GiB free; the TTFT step is a collapse within minutes.
- cache_fits / cache_too_big: llama-server's prompt cache growing 6,000 MiB/h toward its 8,192 MiB cap, with 20 GiB
  and with 6 GiB available (llama.cpp #25740, #26216): nothing, then a memory verdict before memory runs out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.detect.changepoint import ChangeDetector, DetectorSettings, memory_forecast
from harness.soak.explain import explain
from harness.soak.figures import cache_outlook, stall_to_flag

T0 = 1_700_000_000.0
WINDOW_S = 60.0
HOUR = 3600.0
STALL_FLOOR_S = 5.0
HORIZON_S = 3600.0


@dataclass(frozen=True)
class Outcome:
    shape: str
    first_verdict: str  # kind (metric), or "none"
    at_h: float | None  # engine uptime of the first verdict
    verdicts: int
    note: str


def _window(i: int, rng: np.random.Generator, noise: float, **fields: Any) -> dict[str, Any]:
    n = 1.0 + noise * rng.standard_normal(4)
    w = {
        "t_start_unix": T0 + i * WINDOW_S,
        "t_end_unix": T0 + (i + 1) * WINDOW_S,
        "t_unix": T0 + (i + 0.5) * WINDOW_S,
        "engine_uptime_s": (i + 1) * WINDOW_S,
        "engine_pid": 1,
        "users": 4,
        "contaminated": False,
        "output_tps": 100.0 * n[0],
        "decode_tps": 40.0 * n[1],
        "ttft_p95_s": 0.8 * n[2],
        "error_ratio": 0.0,
        "engine_memory_mib": 2000.0 * n[3] / n[3],
        "engine_rss_mib": 2000.0,
        "cpu": {"engine_cores": 1.9},
    }
    w.update(fields)
    return w


def gc_pauses(seed: int, noise: float) -> Outcome:
    rng = np.random.default_rng(seed)
    flagged, verdicts, first = 0.0, [], None
    for i in range(int(6.5 * HOUR / WINDOW_S)):
        up_h = (i + 1) * WINDOW_S / HOUR
        pause = max(0.0, 7.0 + (46.0 - 7.0) * (up_h - 1.0) / 5.5)
        w = _window(
            i,
            rng,
            noise,
            probe_max_s=pause if i % 5 == 4 else 0.01 * (1 + noise * rng.standard_normal()),
            max_chunk_gap_s=0.05,
        )
        stall = stall_to_flag(w, STALL_FLOOR_S, flagged)
        if stall is not None:
            flagged = stall
            verdicts.append((up_h, stall))
            first = first or (up_h, stall)
    killed_h = 1.0 + (20.0 - 7.0) * 5.5 / 39.0
    return Outcome(
        "gc_pauses",
        "stall",
        first[0] if first else None,
        len(verdicts),
        f"first at a {first[1]:.1f}-s pause; a 20-s health check kills at {killed_h:.1f} h" if first else "",
    )


def _detect(windows: list[dict[str, Any]], settings: DetectorSettings) -> list[tuple[float, str, dict[str, Any]]]:
    det = ChangeDetector(settings)
    out = []
    out.extend(
        (w["engine_uptime_s"] / HOUR, ev.metric, {"onset": ev.onset_unix})
        for w in windows
        for ev in det.update(w)
        if ev.kind == "collapse"
    )
    return out


def acceptance_decay(seed: int, noise: float) -> Outcome:
    rng = np.random.default_rng(seed)
    wins = []
    for i in range(int(3.5 * HOUR / WINDOW_S)):
        up_h = (i + 1) * WINDOW_S / HOUR
        x = min(1.0, max(0.0, (up_h - 1.0) / 2.0))
        wins.append(
            _window(
                i,
                rng,
                noise,
                acceptance=(0.58 - 0.355 * x) * (1 + noise * rng.standard_normal()),
                kv_usage=0.36 + 0.11 * x,
                prefix_hit_rate=0.9 - 0.0 * x,
            )
        )
    found = _detect(wins, DetectorSettings())
    if not found:
        return Outcome("acceptance_decay", "none", None, 0, "")
    at_h, metric, ev = found[0]
    why = explain(wins, ev["onset"], metric)
    moved = ", ".join(m.text() for m in why.moved) or "nothing else past its threshold yet"
    return Outcome("acceptance_decay", f"collapse ({metric})", at_h, len(found), f"moved with it: {moved}")


def leak_then_latency(seed: int, noise: float) -> Outcome:
    rng = np.random.default_rng(seed)
    wins, verdicts = [], []
    available = 20_480.0
    for i in range(int(12 * HOUR / WINDOW_S)):
        up_h = (i + 1) * WINDOW_S / HOUR
        mem = 4096.0 + 90.0 * 150.0 * 3600.0 * up_h / 2**20
        w = _window(
            i,
            rng,
            noise,
            engine_memory_mib=mem * (1 + 0.002 * rng.standard_normal()),
            ttft_p95_s=(2.4 if up_h >= 7.0 else 0.8) * (1 + noise * rng.standard_normal()),
        )
        wins.append(w)
        recent = [x for x in wins if x["t_unix"] >= w["t_unix"] - 1800.0]
        fc = memory_forecast(
            [x["t_unix"] for x in recent], [x["engine_memory_mib"] for x in recent], available - (mem - 4096.0)
        )
        if fc is not None and fc.headroom_s is not None and fc.headroom_s < HORIZON_S:
            verdicts.append((up_h, "memory"))
    found = [(h, f"collapse ({m})") for h, m, _ in _detect(wins, DetectorSettings())]
    allv = sorted(verdicts + found)
    if not allv:
        return Outcome("leak_then_latency", "none", None, 0, "")
    return Outcome(
        "leak_then_latency",
        allv[0][1],
        allv[0][0],
        len(allv),
        f"TTFT step at 7.00 h; memory verdicts: {len(verdicts)} (+46 MiB/h against 20 GiB free)",
    )


def _cache(name: str, available: float, seed: int, noise: float) -> Outcome:
    rng = np.random.default_rng(seed)
    pts: list[tuple[float, float]] = []
    first = None
    runs_out_h = None
    for i in range(int(2 * HOUR / WINDOW_S)):
        up_h = (i + 1) * WINDOW_S / HOUR
        size = min(8192.0, 431.0 + 6000.0 * up_h) * (1 + 0.01 * rng.standard_normal())
        pts.append((T0 + (i + 0.5) * WINDOW_S, size))
        pts = [p for p in pts if p[0] >= pts[-1][0] - 1800.0]
        left = available - size
        if left <= 0 and runs_out_h is None:
            runs_out_h = up_h
        out = cache_outlook(pts, 8192.0, max(0.0, left))
        if first is None and out is not None and out.runs_out_s is not None and out.runs_out_s < HORIZON_S:
            first = up_h
    note = f"memory runs out at {runs_out_h:.2f} h" if runs_out_h else "the cache stops at its cap"
    return Outcome(name, "memory (prompt_cache_mib)" if first else "none", first, int(first is not None), note)


SHAPES: dict[str, Callable[[int, float], Outcome]] = {
    "gc_pauses": gc_pauses,
    "acceptance_decay": acceptance_decay,
    "leak_then_latency": leak_then_latency,
    "cache_fits": lambda seed, noise: _cache("cache_fits", 20_480.0, seed, noise),
    "cache_too_big": lambda seed, noise: _cache("cache_too_big", 6_144.0, seed, noise),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.03)
    args = ap.parse_args(argv)
    print(f"| shape | first verdict | engine uptime h (median, worst of {args.seeds} seeds) | verdicts | note |")
    print("|---|---|---:|---:|---|")
    for name, fn in SHAPES.items():
        outs = [fn(seed, args.noise) for seed in range(args.seeds)]
        kinds = sorted({o.first_verdict for o in outs})
        ats = [o.at_h for o in outs if o.at_h is not None]
        at = f"{np.median(ats):.2f}, {max(ats):.2f}" if ats else "–"
        print(
            f"| {name} | {' / '.join(kinds)} | {at} | {int(np.median([o.verdicts for o in outs]))} | {outs[0].note} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
