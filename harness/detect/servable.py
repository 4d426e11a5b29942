"""Servable context and the SLO test: one definition each, for the runner and the report.

``servable_context`` turns a capacity record (the parsed start-up log, capacity/*.json) and a
memory budget into the context that fits; the runner's fill check starts the engine at it and
the report's memory table shows it. ``slo_verdict`` says whether the requests of one stream count
met the scenario's SLO; the runner's ramp and the report's max-streams table both use it. ``goodput``
counts the requests of a phase that met it one by one (every phase record's ``goodput_rps``).
Definitions: docs/metrics.md#memory, #max-streams and #goodput.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.common.stats import median, number_or_none, percentile


@dataclass(frozen=True)
class Servable:
    fixed_mib: float  # weights + compute buffers + recurrent state, target and drafter
    kv_kib_per_token: float  # target + draft KV per token of context
    ctx_total: int | None  # tokens of context the budget holds, all slots together
    ctx_per_slot: int | None  # what one request can use (all of it when the KV cache is unified)


def kv_kib_per_token(kv_mib: Any, ctx_total: Any) -> float | None:
    """KiB of KV cache per token of context: the buffer the log reports over the context it holds."""
    kv, ctx = number_or_none(kv_mib), number_or_none(ctx_total)
    if kv is None or not ctx:
        return None
    return kv * 1024.0 / ctx


def servable_context(cap: dict[str, Any], budget_mib: float | None) -> Servable | None:
    """(budget − weights − compute − recurrent state) / (target + draft KV per token); None without a
    target KV buffer in the log. ``ctx_total`` is None without a budget."""
    t = cap.get("target") or {}
    d = cap.get("draft") or {}
    ctx = cap.get("ctx_total")
    t_kv = kv_kib_per_token(t.get("kv_mib"), ctx)
    if t_kv is None:
        return None
    per_tok = t_kv + (kv_kib_per_token(d.get("kv_mib"), ctx) or 0.0)
    fixed = sum(number_or_none(m.get(k)) or 0.0 for m in (t, d) for k in ("model_mib", "compute_mib", "recurrent_mib"))
    if not budget_mib or per_tok <= 0:
        return Servable(fixed, per_tok, None, None)
    tokens = math.floor(max(0.0, (budget_mib - fixed) * 1024.0 / per_tok))
    slots = number_or_none(cap.get("slots"))
    per_slot = math.floor(tokens / slots) if slots and not cap.get("kv_unified") else tokens
    return Servable(fixed, per_tok, tokens, per_slot)


@dataclass(frozen=True)
class SloResult:
    passed: bool
    per_stream_tps: float | None  # median decode t/s of the successful requests
    ttft_p95_s: float | None
    failed: int
    why: str  # empty when passed

    def evidence(self, n: int) -> str:
        tps = f"{self.per_stream_tps:.1f}" if self.per_stream_tps is not None else "–"
        p95 = f"{self.ttft_p95_s:.2f}" if self.ttft_p95_s is not None else "–"
        return (
            f"N={n}: {tps} t/s/stream, TTFT p95 {p95} s"
            + (f", {self.failed} failed" if self.failed else "")
            + (" ✗" if self.why else " ✓")
        )


def slo_verdict(requests: Iterable[tuple[str, Any, Any]], tps_min: float | None, ttft_max: float | None) -> SloResult:
    """``requests``: (status, decode_tps, ttft_s) of every request at one stream count. Served means no
    failed request, median per-stream decode t/s ≥ ``tps_min`` and TTFT p95 ≤ ``ttft_max`` (each when set)."""
    failed = 0
    tps: list[float] = []
    ttft: list[float] = []
    for status, decode_tps, ttft_s in requests:
        if status != "ok":
            failed += 1
            continue
        if number_or_none(decode_tps) is not None:
            tps.append(float(decode_tps))
        if number_or_none(ttft_s) is not None:
            ttft.append(float(ttft_s))
    med, p95 = median(tps), percentile(ttft, 95)
    why: list[str] = []
    if failed:
        why.append(f"{failed} failed request(s)")
    if tps_min is not None and (med is None or med < tps_min):
        why.append(f"per-stream {med or 0:.1f} t/s < {tps_min:g}")
    if ttft_max is not None and (p95 is None or p95 > ttft_max):
        why.append(f"TTFT p95 {p95 if p95 is not None else float('nan'):.2f} s > {ttft_max:g} s")
    return SloResult(not why, med, p95, failed, "; ".join(why))


def meets_slo(
    status: str,
    ttft_s: Any,
    decode_tps: Any,
    e2e_s: Any,
    send_delay_s: Any,
    tps_min: float | None,
    ttft_max: float | None,
    e2e_max: float | None,
) -> bool:
    """Whether one request counts toward goodput (docs/metrics.md#goodput): it succeeded and meets every bound
    the SLO sets. TTFT and end-to-end time count from the request's scheduled time (its ``send_delay_s`` added:
    an open-loop request held back by ``max_in_flight`` cannot meet the SLO by starting late); a request
    whose figure is unknown (no decode t/s from a single chunk) does not meet that bound."""
    if status != "ok":
        return False
    delay = number_or_none(send_delay_s) or 0.0
    if ttft_max is not None and (number_or_none(ttft_s) is None or float(ttft_s) + delay > ttft_max):
        return False
    if tps_min is not None and (number_or_none(decode_tps) is None or float(decode_tps) < tps_min):
        return False
    if e2e_max is not None and (number_or_none(e2e_s) is None or float(e2e_s) + delay > e2e_max):  # noqa: SIM103  one check per bound
        return False
    return True


def goodput(
    requests: Iterable[tuple[str, Any, Any, Any, Any]],
    wall_s: float,
    tps_min: float | None,
    ttft_max: float | None,
    e2e_max: float | None,
) -> tuple[int | None, float | None]:
    """``requests``: (status, ttft_s, decode_tps, e2e_s, send_delay_s) of every request of a phase. Returns (how many
    meet the SLO, those per second of the phase's wall time); (None, None) when the SLO sets no per-request bound."""
    if tps_min is None and ttft_max is None and e2e_max is None:
        return None, None
    met = sum(1 for r in requests if meets_slo(*r, tps_min, ttft_max, e2e_max))
    return met, (met / wall_s if wall_s > 0 else None)


def search_max_streams(passes: Callable[[int], bool], start: int, max_streams: int) -> tuple[int, int | None]:
    """The ramp: double N from ``start`` while ``passes(N)``, up to ``max_streams``; after the first
    failure, bisect between the last N that passed and it. Returns (largest passing N, 0 when none;
    smallest failing N, None when every N tried passed). Each N is tried at most once."""
    good, bad = 0, None
    n = start
    while True:
        if passes(n):
            good = n
            if n >= max_streams:
                break
            n = min(n * 2, max_streams)
        else:
            bad = n
            break
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if passes(mid):
            good = mid
        else:
            bad = mid
    return good, bad
