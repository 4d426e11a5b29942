"""What an open-loop soak window was offered and what it got (the schedule itself: harness/load/schedule.py).

The Locust pacing user (locustfile.py ``PacingUser``) sends each request at the time ``soak_offsets`` gives it;
the harness (harness/soak/slice.py) computes the same schedule to say what each window was offered. No locust import:
the arithmetic is tested and plotted without gevent. Definitions: docs/soak.md#open-loop-arrivals.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.detect.servable import meets_slo
from harness.load.schedule import asked_rps, window_level


def window_traffic(
    recs: list[dict[str, Any]],
    seconds: float,
    slo: tuple[float | None, float | None, float | None],
    arrival: dict[str, Any] | None = None,
    schedule: np.ndarray | None = None,
    span_s: tuple[float, float] | None = None,
    duration_s: float = 0.0,
) -> dict[str, Any]:
    """A soak window's traffic figures (docs/soak.md#open-loop-arrivals), from the requests that finished in it:

    - ``achieved_rps``: successful requests / the window's seconds; ``slo_met``: how many met the SLO (``slo``: per-token
      t/s min, TTFT max, end-to-end max; harness/detect/servable.py ``meets_slo``, timed from the scheduled send), and
      ``goodput_rps`` = that / seconds; both None when the SLO sets no per-request bound;
    - open loop (``arrival``, with the slice's ``schedule`` and the window's ``span_s`` in soak seconds): ``asked_rps``
      (the curve's mean rate over the span), ``scheduled`` (arrivals the schedule put in the span) and ``offered_rps``
      (those / the span's seconds), ``late`` (late sends among the window's requests), ``max_send_delay_s``, and ``load_level``
      (the change detector's level; None when the rate crossed levels inside the window).
    """
    ok = sum(1 for r in recs if r.get("status") == "ok")
    met = (
        sum(
            1
            for r in recs
            if meets_slo(
                r.get("status") or "", r.get("ttft_s"), r.get("decode_tps"), r.get("e2e_s"), r.get("send_delay_s"), *slo
            )
        )
        if any(b is not None for b in slo)
        else None
    )
    out: dict[str, Any] = {
        "achieved_rps": ok / seconds if seconds > 0 else None,
        "slo_met": met,
        "goodput_rps": met / seconds if met is not None and seconds > 0 else None,
    }
    if arrival is None or schedule is None or span_s is None:
        return out
    s0, s1 = span_s
    delays = [float(r["send_delay_s"]) for r in recs if r.get("send_delay_s") is not None]
    scheduled = int(np.count_nonzero((schedule >= s0) & (schedule < s1)))
    asks = s1 > s0  # an empty span (the drain after the slice's schedule ended) asks and offers nothing
    out.update(
        {
            "soak_t_start_s": s0,
            "soak_t_end_s": max(s0, s1),
            "asked_rps": asked_rps(arrival, s0, s1, duration_s) if asks else None,
            "scheduled": scheduled,
            "offered_rps": scheduled / (s1 - s0) if asks else None,
            "late": sum(1 for r in recs if r.get("late")),
            "max_send_delay_s": max(delays) if delays else None,
            "load_level": window_level(arrival, s0, s1, duration_s) if asks else None,
        }
    )
    return out
