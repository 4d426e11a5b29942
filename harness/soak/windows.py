"""A soak window's figures from its request records: what the window itself streamed, and what its counts imply.

- **Throughput from the tokens streamed inside the window.** A record holds its start, its TTFT, the gap before each
  later chunk (``itl_s``) and each chunk's tokens (``chunk_tokens``), so each chunk's time is rebuilt; a window's
  ``output_tps`` is the tokens whose chunk time lies in ``[t0, t1)`` over ``t1 - t0``, and a request that streamed
  across two windows counts in both. Counting whole requests by when they finished quantises the figure (one
  closed-loop user, 32-token answers, 8-s windows: 4 or 5 finished requests, 15.9 or 19.8 t/s, nothing between).
- **Per-request figures keep their request's window**: the window in which it ended (start + end-to-end time):
  request and error counts, median decode t/s, TTFT p95.
- **Open loop: the decode t/s of requests that ran alone** (``alone_decode_tps``). At a Poisson level the requests a
  window holds shared the engine with 0 to 3 others by chance, and per-request decode t/s follows that (25 to 77 t/s
  at one 0.15-rps level on llama-server here, docs/detector.md#alone-decode); a request no other overlapped decodes at
  the engine's own speed whatever the level (63 to 81 t/s in every window with two such requests, at every level of
  the same soak).
- **Count-implied standard errors** (``count_sd``): what the window's own counts alone make each figure wander by,
  so the change detector's sigma is never below them (harness/detect/changepoint.py): Poisson arrivals for open-loop
  throughput, one request in or out at the window's edges for closed loop, a median or a 95th percentile over n
  requests (open loop: at least one request's streaming time, a Poisson burst's wait), a failure share over n
  requests, acceptance over the drafted tokens or, when wider, over the requests' own acceptances.
- **The open-loop backlog**: requests scheduled before a window's end and not finished by it. A level's reference
  is learned only from windows where that backlog holds still (``load_settled``), and windows where it falls (the
  queue an earlier, heavier level left, draining) are not judged (``draining``), nor those that still hold that queue
  (``backlog_inherited``) until it is down to what the level's settled windows held.

Pure functions: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MEDIAN_SE = 1.2533  # standard error of a median over n Gaussian samples = this x sd / sqrt(n)
MAD_TO_SIGMA = 1.4826
EDGE_REQUESTS = 0.5  # closed loop: a window's token count moves by about half a request per user at its edges
BACKLOG_SPAN = 2  # windows over which the open-loop backlog must hold still (or is seen falling)
ALONE_SHARE = 0.25  # a request ran alone when others were in flight for less than this share of its time, on average
MIN_ALONE = 2  # a window's alone_decode_tps needs this many requests that ran alone


def chunk_times(rec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Each streamed chunk's unix time and tokens; None when the record streamed nothing. A stream that did not
    say its chunks' tokens spreads the record's output tokens evenly over its chunks."""
    start, ttft = rec.get("start_unix_s"), rec.get("ttft_s")
    if start is None or ttft is None:
        return None
    itl = rec.get("itl_s") or []
    times = float(start) + float(ttft) + np.concatenate(([0.0], np.cumsum(np.asarray(itl, dtype=float))))
    tokens = rec.get("chunk_tokens")
    if tokens is not None and len(tokens) == len(times):
        return times, np.asarray(tokens, dtype=float)
    return times, np.full(len(times), float(rec.get("output_tokens") or 0) / len(times))


def end_unix(rec: dict[str, Any]) -> float:
    """When a request ended: its start plus its end-to-end time (its start alone when it has none)."""
    return float(rec.get("start_unix_s") or 0.0) + float(rec.get("e2e_s") or 0.0)


def take_ended(
    unassigned: Sequence[dict[str, Any]], t1: float, last: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the records a window ending at ``t1`` takes: those that ended before ``t1``, including any that arrived after
    an earlier window was judged; the rest). ``last``: the slice's last window takes them all."""
    ended = [r for r in unassigned if last or end_unix(r) < t1]
    rest = [r for r in unassigned if not last and end_unix(r) >= t1]
    return ended, rest


def streamed(recs: Sequence[dict[str, Any]], t0: float, t1: float) -> tuple[float, int]:
    """Tokens whose chunk time lies in ``[t0, t1)``, and how many requests streamed them."""
    tokens, n = 0.0, 0
    for r in recs:
        ct = chunk_times(r)
        if ct is None:
            continue
        times, tok = ct
        inside = (times >= t0) & (times < t1)
        if inside.any():
            tokens += float(tok[inside].sum())
            n += 1
    return tokens, n


def ran_alone(
    rec: dict[str, Any], intervals: Sequence[tuple[float, float]], starts: Sequence[float], longest_s: float
) -> bool:
    """Whether other requests were in flight for less than ALONE_SHARE of ``rec``'s time, on average. ``intervals``:
    (start, end) of the requests that may have overlapped it, ``rec`` itself included, sorted by start; ``starts``:
    their starts; ``longest_s``: the longest of them. Looks only at those that started within ``longest_s`` before
    it, nearest first, and stops once the share is reached (at a high rate, at once)."""
    s, e = float(rec.get("start_unix_s") or 0.0), end_unix(rec)
    if e <= s:
        return False
    lo, hi = bisect.bisect_left(starts, s - longest_s), bisect.bisect_left(starts, e)
    limit = ALONE_SHARE * (e - s) + (e - s)  # its own interval counts once
    shared = 0.0
    for a, b in reversed(intervals[lo:hi]):
        shared += max(0.0, min(e, b) - max(s, a))
        if shared >= limit:
            return False
    return True


def window_figures(
    ended: Sequence[dict[str, Any]],
    overlapping: Sequence[dict[str, Any]],
    t0: float,
    t1: float,
    open_loop: bool,
    users: int | None,
    intervals: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """The window's request figures. ``ended``: the records that ended in ``[t0, t1)``; ``overlapping``: every record
    that may have streamed in it (a superset is fine). ``users``: the closed-loop users (the edge model's size).
    Open loop, ``intervals``: (start, end) of the slice's requests that may have overlapped those that ended in it
    (``ran_alone``)."""
    ok = [r for r in ended if r.get("status") == "ok"]
    errors = len(ended) - len(ok)
    kinds: dict[str, int] = defaultdict(int)
    for r in ended:
        if r.get("error_kind"):
            kinds[r["error_kind"]] += 1
    seconds = t1 - t0
    tokens, streaming = streamed(overlapping, t0, t1)
    decode = [float(r["decode_tps"]) for r in ok if r.get("decode_tps")]
    ttft = [float(r["ttft_s"]) for r in ok if r.get("ttft_s") is not None]
    out: dict[str, Any] = {
        "requests": len(ended),
        "errors": errors,
        "error_kinds": dict(kinds),
        "output_tokens": round(tokens),
        "streaming_requests": streaming,
        # nothing streamed is an output rate of 0, not "no value": a collapse to zero shows
        "output_tps": tokens / seconds if seconds > 0 else None,
        "decode_tps": float(np.median(decode)) if decode else None,
        "ttft_p95_s": float(np.percentile(ttft, 95)) if ttft else None,
        "error_ratio": errors / len(ended) if ended else None,
    }
    out["count_sd"] = {
        "output_tps": throughput_sd(out["output_tps"], len(ok), open_loop, users),
        "decode_tps": median_sd(decode),
        "ttft_p95_s": ttft_sd(
            ttft,
            [
                float(r["e2e_s"]) - float(r["ttft_s"])
                for r in ok
                if r.get("e2e_s") is not None and r.get("ttft_s") is not None
            ],
            open_loop,
        ),
        "error_ratio": share_sd(errors, len(ended)),
    }
    if open_loop:
        ivs = sorted(intervals)
        starts, longest = [a for a, _ in ivs], max((b - a for a, b in ivs), default=0.0)
        solo = [float(r["decode_tps"]) for r in ok if r.get("decode_tps") and ran_alone(r, ivs, starts, longest)]
        enough = len(solo) >= MIN_ALONE
        out["alone_requests"] = len(solo)
        out["alone_decode_tps"] = float(np.median(solo)) if enough else None
        out["count_sd"]["alone_decode_tps"] = median_sd(solo) if enough else None
    return out


def throughput_sd(tps: float | None, finished_ok: int, open_loop: bool, users: int | None) -> float | None:
    """Open loop: requests arrive as a Poisson process, so the window's tokens wander by 1/sqrt(n) of themselves.
    Closed loop: each user's requests follow one another, so the window's tokens move only at its two edges, by
    about half a request per user (independent users add in quadrature)."""
    if tps is None or finished_ok < 1:
        return None
    if open_loop:
        return tps / math.sqrt(finished_ok)
    return tps * EDGE_REQUESTS * math.sqrt(max(1, users or 1)) / finished_ok


def median_sd(values: Sequence[float]) -> float | None:
    """A median over n requests wanders by 1.2533 x their spread / sqrt(n) (the spread: 1.4826 x MAD)."""
    if len(values) < 2:
        return None
    v = np.asarray(values, dtype=float)
    return MEDIAN_SE * MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v)))) / math.sqrt(len(v))


def p95_sd(values: Sequence[float]) -> float | None:
    """A 95th percentile over n requests: its rank is uncertain by sqrt(0.95 x 0.05 / n), so half the spread of
    the sample quantiles that far either side (with a few requests, from the 85th percentile to the maximum)."""
    if len(values) < 2:
        return None
    d = math.sqrt(0.95 * 0.05 / len(values))
    lo, hi = np.percentile(np.asarray(values, dtype=float), [100 * max(0.0, 0.95 - d), 100 * min(1.0, 0.95 + d)])
    return float(hi - lo) / 2


def ttft_sd(ttft: Sequence[float], service_s: Sequence[float], open_loop: bool) -> float | None:
    """TTFT p95 (``p95_sd``); open loop, at least one request's streaming time (the median of ``service_s``): Poisson
    arrivals come in bursts, and a request that arrives with the slots busy waits for one to end, so a window's p95
    moves by about that whether or not its own few requests met a burst."""
    sd = p95_sd(ttft)
    if open_loop and service_s and sd is not None:
        return max(sd, float(np.median(service_s)))
    return sd


def share_sd(failed: int, n: int) -> float | None:
    """A failure share over n requests (binomial; half a failure added, so a window without one still has a spread)."""
    if n < 1:
        return None
    p = (failed + 0.5) / (n + 1)
    return math.sqrt(p * (1 - p) / n)


def acceptance_sd(
    acceptance: float | None, drafted: int | None, per_request: Sequence[tuple[float, float]] = ()
) -> float | None:
    """Accepted over drafted tokens: binomial over the drafted tokens, or, when larger, the spread between the
    window's requests (``per_request``: each one's drafted and accepted tokens). Acceptance follows the prompt (n-gram
    lookup accepted 14% to 100% a window at one level on llama-server here), so a window's figure wanders by which
    prompts it drew, far more than its tokens' binomial says: the ratio estimator's standard error,
    sqrt(sum((a_i - R d_i)^2) / (n (n - 1))) / mean(d), R = sum(a) / sum(d), over n >= 2 requests that drafted."""
    if acceptance is None or not drafted or drafted < 1:
        return None
    a = min(1.0, max(0.0, float(acceptance)))
    binomial = math.sqrt(max(a * (1 - a), 0.25 / drafted) / drafted)
    pairs = np.asarray([(d, k) for d, k in per_request if d > 0], dtype=float).reshape(-1, 2)
    if len(pairs) < 2:
        return binomial
    d, k = pairs[:, 0], pairs[:, 1]
    ratio = k.sum() / d.sum()
    spread = math.sqrt(float(((k - ratio * d) ** 2).sum()) / (len(d) * (len(d) - 1))) / float(d.mean())
    return max(binomial, spread)


def drafted_per_request(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """(drafted, accepted) tokens of each ok request that says them (the engine's timings, harness/load/client.py)."""
    return [
        (float(r["draft_tokens"]), float(r["accepted_tokens"]))
        for r in records
        if r.get("status") == "ok"
        and isinstance(r.get("draft_tokens"), int | float)
        and isinstance(r.get("accepted_tokens"), int | float)
    ]


def outstanding(
    schedule_s: np.ndarray, slice_start_s: float, soak_t_s: float, ends_unix: list[float], t_unix: float
) -> int:
    """Open loop: requests the slice's schedule sent in ``[slice_start_s, soak_t_s)`` (soak seconds) that had not
    ended by ``t_unix``, in the sender's queue or the engine's (``ends_unix``: the slice's records' end times, ascending)."""
    sent = int(np.count_nonzero((schedule_s >= slice_start_s) & (schedule_s < soak_t_s)))
    return max(0, sent - bisect.bisect_left(ends_unix, t_unix))


@dataclass
class Backlog:
    """What ``load_state`` reads of an open-loop slice's earlier windows: the last BACKLOG_SPAN of them, and per load
    level the largest backlog one of its settled windows held. Fed one window at a time (``add``): constant work and
    memory per window, however long the slice."""

    recent: deque[Mapping[str, Any]] = field(default_factory=lambda: deque(maxlen=BACKLOG_SPAN))
    settled_max: dict[Any, int] = field(default_factory=dict)

    @classmethod
    def of(cls, windows: Sequence[Mapping[str, Any]]) -> Backlog:
        backlog = cls()
        for w in windows:
            backlog.add(w)
        return backlog

    def add(self, win: Mapping[str, Any]) -> None:
        self.recent.append(win)
        end = win.get("outstanding_end")
        if win.get("load_settled") and end is not None:
            level = win.get("load_level")
            self.settled_max[level] = max(self.settled_max.get(level, 0), int(end))


def load_state(backlog: Backlog, win: Mapping[str, Any]) -> dict[str, Any]:
    """Open loop: whether the window's backlog held still (``load_settled``: a reference may be learned from it), fell
    (``draining``: the queue a heavier level left; not judged), or is still the queue an earlier level left
    (``backlog_inherited``; not judged). Settled: the last BACKLOG_SPAN windows at the same level and none of them
    draining, no late send, the backlog neither falling nor rising over them, and under one window's arrivals.
    Inherited: the level began with a backlog, and it has not yet come down to what the level's settled windows held
    (or, before any, to one window's arrivals): the engine still serves at the concurrency that queue gives it, so
    its per-request figures are not the level's, even in a window whose fall Poisson noise hid. ``backlog``: the
    slice's earlier windows (``Backlog.of`` a list of them, oldest first, each with ``outstanding_end``, ``scheduled``
    and ``load_level``). Noise: the arrivals are Poisson, so a backlog moving by less than 2 sqrt(scheduled) + 1 over
    the span has not moved."""
    level, end = win.get("load_level"), win.get("outstanding_end")
    span = list(backlog.recent)
    same = len(span) == BACKLOG_SPAN and all(w.get("load_level") == level for w in span) and level is not None
    start = span[0] if same else (span[-1] if span else None)  # across a level change: over the last window only
    if end is None or start is None or start.get("outstanding_end") is None:
        return {"draining": False, "load_settled": False, "backlog_inherited": False}
    before = int(start["outstanding_end"])
    scheduled = sum(int(w.get("scheduled") or 0) for w in (span[1:] if same else [])) + int(win.get("scheduled") or 0)
    slack = 2 * math.sqrt(scheduled) + 1
    falling = before - end > slack
    rising = end - before > slack
    # drained: less than one window's arrivals still waiting (in a stable queue a request spends less than a window
    # in the system; the settling of windows assumes it too). The first windows at a level are the transition: never
    # a reference, whatever the backlog says
    sched = int(win.get("scheduled") or 0)
    noise = 2 * math.sqrt(sched) + 1  # one window's arrivals wander this much
    drained = end <= sched + noise
    after_drain = any(w.get("draining") for w in span)  # a drain's last windows look still by chance: wait it out
    prev = span[-1]
    carried = level is not None and (prev.get("load_level") != level or bool(prev.get("backlog_inherited")))
    usual = backlog.settled_max.get(level, sched)
    inherited = carried and end > usual + noise
    return {
        "draining": falling,
        "load_settled": same
        and drained
        and not after_drain
        and not falling
        and not rising
        and not inherited
        and not win.get("late"),
        "backlog_inherited": inherited,
    }


def load_key(win: Mapping[str, Any]) -> Any:
    """A window's load level: ``load_level`` in an open-loop soak, else ``users`` (None: it changed inside the window)."""
    return win.get("load_level") if "load_level" in win else win.get("users")
