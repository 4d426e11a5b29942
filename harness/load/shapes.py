"""Traffic shapes as pure functions of time: how many streams should be running at ``t``.

The Locust ``LoadTestShape`` in locustfile.py calls :func:`users_at`; keeping the arithmetic
here (no locust import) lets the harness test and plot shapes without gevent.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.common import jsonsafe


def users_at(shape: dict[str, Any], t: float, duration_s: float) -> int:
    """Target stream count at ``t`` seconds into a soak of ``duration_s`` (shape as a dict)."""
    kind = shape.get("kind", "steady")
    users = int(shape.get("users", 1))
    start = int(shape.get("start_users", 1))
    if kind == "steady" or kind == "replay":
        return users
    if kind == "ramp":
        frac = min(1.0, max(0.0, t / duration_s)) if duration_s > 0 else 1.0
        return max(1, round(start + (users - start) * frac))
    if kind == "diurnal":
        # one day compressed into `period_s`: trough at t=0 ("midnight"), peak half a period later
        period = float(shape.get("period_s") or duration_s)
        phase = (t % period) / period
        level = 0.5 - 0.5 * math.cos(2 * math.pi * phase)
        return max(1, round(start + (users - start) * level))
    if kind == "bursts":
        period = float(shape.get("period_s") or 60.0)
        burst = float(shape.get("burst_s", 10.0))
        in_burst = (t % period) >= period - burst
        return int(shape.get("peak_users") or users) if in_burst else users
    raise ValueError(f"unknown shape kind '{kind}'")


def load_trace(path: Path) -> list[tuple[float, str | None]]:
    """A replay trace: one JSON object per line with ``t_s`` (offset, seconds) and optional ``prompt_id``."""
    out: list[tuple[float, str | None]] = []
    for n, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{n}: not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            obj = jsonsafe.loads(line)
            t_s, pid = obj["t_s"], obj.get("prompt_id")
            seconds = float(t_s) if not isinstance(t_s, bool) else math.nan
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise ValueError(f'{path}:{n}: a trace line is {{"t_s": seconds, "prompt_id": optional}} ({exc})') from None
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"{path}:{n}: t_s is the seconds from the start, a number >= 0, not {str(t_s)[:40]!r}")
        if pid is not None and not isinstance(pid, str):
            raise ValueError(f"{path}:{n}: prompt_id is the id of a prompt, a string, not {str(pid)[:40]!r}")
        out.append((seconds, pid))
    out.sort(key=lambda x: x[0])
    return out
