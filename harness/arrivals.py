"""Open-loop arrivals: when each request of a phase is sent, and the client that sends it then.

A closed-loop stream (harness/client.py ``run_streams``) sends its next request when the last one
ends, so a slow engine is offered less load and never sees a queue. Here the schedule is drawn first
(``schedule``: pure, seeded numpy) and ``run_arrivals`` sends each request at its time whatever the
answers before it, up to ``max_in_flight`` at once. A request due while that many are in flight waits
for a slot and is recorded **late** with its send delay: never silently delayed. Definitions:
docs/metrics.md#open-loop-phases.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from engines.base import Engine
from harness.client import RequestParams, race_stop, stream_one, until_stopped
from harness.prompts import Prompt
from harness.records import RequestRecord
from harness.scenario import Arrival, ArrivalKind, Stage

# A request sent this much after its scheduled time is late even with a slot free: the client itself
# (its event loop, a busy CPU) could not keep the schedule.
LATE_AFTER_S = 0.010


@dataclass(frozen=True)
class Schedule:
    """Send times of one phase, in seconds from its start (ascending, the first at 0 or at its stage's start),
    and the span they were drawn over: ``offered_rps = len(offsets_s) / span_s``."""

    offsets_s: np.ndarray
    span_s: float

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def offered_rps(self) -> float | None:
        return len(self.offsets_s) / self.span_s if self.span_s > 0 else None


def gaps(kind: ArrivalKind, rate_rps: float, n: int, rng: np.random.Generator, cv: float | None = None) -> np.ndarray:
    """``n`` gaps between arrivals at mean ``rate_rps``: constant 1/rate; exponential with mean 1/rate (a
    Poisson process); gamma with shape 1/cv² and scale cv²/rate (mean 1/rate, coefficient of variation cv)."""
    mean = 1.0 / rate_rps
    if kind == "constant":
        return np.full(n, mean)
    if kind == "poisson":
        return rng.exponential(mean, n)
    if kind == "gamma":
        if cv is None or cv <= 0:
            raise ValueError("gamma gaps need a coefficient of variation cv > 0")
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, mean / shape, n)
    raise ValueError(f"unknown arrival kind '{kind}'")


def rate_schedule(kind: ArrivalKind, rate_rps: float, requests: int, seed: Any, cv: float | None = None) -> Schedule:
    """``requests`` arrivals at ``rate_rps``: the first at 0, each next one gap later; the span is the sum of
    all ``requests`` gaps (the last gap closes it), so a constant schedule offers exactly ``rate_rps``."""
    g = gaps(kind, rate_rps, requests, np.random.default_rng(seed), cv)
    offsets = np.concatenate(([0.0], np.cumsum(g[:-1])))
    return Schedule(offsets, float(g.sum()))


def stages_schedule(kind: ArrivalKind, stages: Sequence[Stage], seed: Any, cv: float | None = None) -> Schedule:
    """The stages one after the other: in each, arrivals from the stage's start (the first at it), one gap of
    the stage's rate apart, while before the stage's end. The span is the stages' total duration."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    start = 0.0
    for st in stages:
        drawn: list[np.ndarray] = []
        total = 0.0
        batch = max(16, math.ceil(st.rate_rps * st.duration_s * 1.25) + 8)
        while total < st.duration_s:  # gaps until their sum passes the stage's end
            g = gaps(kind, st.rate_rps, batch, rng, cv)
            drawn.append(g)
            total += float(g.sum())
        t = np.concatenate(([0.0], np.cumsum(np.concatenate(drawn))))
        # before the end, with room for rounding: ten sums of 0.1 s make 0.9999999999999999, the stage's end, not before it
        parts.append(start + t[t < st.duration_s - 1e-9 * max(1.0, st.duration_s)])
        start += st.duration_s
    return Schedule(np.concatenate(parts) if parts else np.zeros(0), start)


def schedule(arrival: Arrival, key: str, repetition: int) -> Schedule:
    """The schedule of the open-loop phase ``key`` (a rate's key, or 'stages'), repetition ``repetition``: the
    same in every configuration (paired comparisons), another draw in every repetition and phase."""
    keys = arrival.keys()
    if key not in keys:
        raise ValueError(f"no open-loop phase '{key}'; phases: {', '.join(keys)}")
    seed = [arrival.seed & 0xFFFFFFFF, keys.index(key), repetition]
    rate = arrival.rate_of(key)
    if rate is not None:
        return rate_schedule(arrival.kind, rate, arrival.requests, seed, arrival.cv)
    return stages_schedule(arrival.kind, arrival.stages or [], seed, arrival.cv)


def arrival_prompt_offset(arrival: Arrival, repetitions: int, key: str, repetition: int) -> int:
    """Where open-loop phase (``key``, ``repetition``) starts in the prompt list: the phases, key by key and
    repetition by repetition, each use the next len(schedule) prompts (as ``runner_util.prompt_offset``)."""
    offset = 0
    for k in arrival.keys():
        for r in range(1, repetitions + 1):
            if (k, r) == (key, repetition):
                return offset
            offset += len(schedule(arrival, k, r))
    raise ValueError(f"no open-loop phase '{key}' repetition {repetition}")


def arrival_figures(records: Sequence[RequestRecord], sched: Schedule, wall_s: float) -> dict[str, Any]:
    """An open-loop phase's figures (docs/metrics.md#open-loop-phases): scheduled requests over the schedule's
    span (offered), successful requests over the phase's wall time (achieved), late sends and the longest delay."""
    ok_recs = [r for r in records if r.status == "ok"]
    ok = len(ok_recs)
    delays = [r.send_delay_s for r in records if r.send_delay_s is not None]
    offered = sched.offered_rps
    # completions against the schedule, both first-to-last (no tail: a phase of a few requests spends part of its
    # wall time on the last answers, which lowers achieved_rps at any rate; harness/saturation.py)
    ends = sorted(r.start_unix_s + r.e2e_s for r in ok_recs if r.e2e_s is not None)
    send_span = float(sched.offsets_s[-1] - sched.offsets_s[0]) if len(sched) > 1 else 0.0
    from_schedule = sorted(r.e2e_s + (r.send_delay_s or 0.0) for r in ok_recs if r.e2e_s is not None)
    return {
        "scheduled": len(sched),
        "scheduled_span_s": round(sched.span_s, 6),
        "offered_rps": offered,
        "achieved_rps": ok / wall_s if wall_s > 0 else None,
        "schedule_rps": (len(sched) - 1) / send_span if send_span > 0 else None,
        "completion_rps": (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and ends[-1] > ends[0] else None,
        "late": sum(1 for r in records if r.late),
        "max_send_delay_s": max(delays) if delays else None,
        "e2e_from_schedule_p50_s": float(np.median(from_schedule)) if from_schedule else None,
    }


async def _stopped_first(aw: Any, stop: asyncio.Event) -> bool:
    """Wait for ``aw`` or ``stop``; True when stop came first (``aw`` is then cancelled)."""
    task = await race_stop(aw, stop)
    if task.done():
        return False
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return True


async def run_arrivals(
    engine: Engine,
    prompts: Sequence[Prompt],
    params: RequestParams,
    offsets_s: Sequence[float],
    max_in_flight: int,
    meta: dict[str, Any],
    on_record: Callable[[RequestRecord], None],
    wall_anchor: tuple[float, int],
    prompt_offset: int = 0,
    stop: asyncio.Event | None = None,
    late_after_s: float = LATE_AFTER_S,
) -> list[RequestRecord]:
    """Send request i at ``offsets_s[i]`` seconds after the call, at most ``max_in_flight`` in flight.

    Every record carries ``scheduled_unix_s``, ``send_delay_s`` (its send time minus its scheduled time) and
    ``late``: it waited for a slot, or went out more than ``late_after_s`` after its time. Requests wait for a
    slot in their scheduled order. Stop semantics are ``run_streams``'s: when ``stop`` is set (or ``on_record``
    fails) no new request is sent, the requests in flight are cut and recorded as 'interrupted', and the first
    error of ``on_record``, if any, is raised.
    """
    url = engine.request_url + engine.chat_path
    extras = engine.request_extras()
    headers = engine.request_headers()
    stop = stop if stop is not None else asyncio.Event()
    anchor_unix, anchor_ns = wall_anchor
    records: list[RequestRecord] = []
    slots = asyncio.Semaphore(max_in_flight)
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int, due_ns: int, waited: bool) -> None:
            try:
                seq = prompt_offset + i
                request = stream_one(session, engine, url, prompts[seq % len(prompts)], params, extras,
                                     {**meta, "stream": 0, "index": i}, wall_anchor, headers, seq)
                rec = await until_stopped(stop, request)
                scheduled = round(anchor_unix + (due_ns - anchor_ns) / 1e9, 6)
                delay = round(max(0.0, rec.start_unix_s - scheduled), 6)
                rec = dataclasses.replace(rec, scheduled_unix_s=scheduled, send_delay_s=delay, late=waited or delay > late_after_s,
                                          id=f"{rec.attempt}/0/{i}" if rec.attempt else rec.id)
                records.append(rec)
                on_record(rec)
            except BaseException:
                stop.set()
                raise
            finally:
                slots.release()

        t0 = time.perf_counter_ns()
        for i, offset in enumerate(offsets_s):
            due_ns = t0 + int(round(float(offset) * 1e9))
            wait_s = (due_ns - time.perf_counter_ns()) / 1e9
            if stop.is_set() or (wait_s > 0 and await _stopped_first(asyncio.sleep(wait_s), stop)):
                break
            waited = slots.locked()  # every slot taken at the request's time: it waits, and is late
            if waited and await _stopped_first(slots.acquire(), stop):
                break
            if not waited:
                await slots.acquire()  # free: returns at once
            if stop.is_set():
                slots.release()
                break
            tasks.append(asyncio.ensure_future(one(i, due_ns, waited)))
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return records
