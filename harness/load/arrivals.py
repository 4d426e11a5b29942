"""Open-loop arrivals: when each request of a phase is sent, and the client that sends it then.

A closed-loop stream (harness/load/client.py ``run_streams``) sends its next request when the last one
ends, so a slow engine is offered less load and never sees a queue. Here the schedule is drawn first
(``schedule``: pure, seeded numpy) and ``run_arrivals`` sends each request at its time whatever the
answers before it, up to ``max_in_flight`` at once. A request due while that many are in flight waits
for a slot and is recorded **late** with its send delay: never silently delayed. Definitions:
docs/metrics.md#open-loop-phases.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np

from engines.base import Engine
from harness.load.client import RequestParams, race_stop, stream_one, until_stopped
from harness.load.schedule import LATE_AFTER_S, Schedule
from harness.prompts import Prompt
from harness.records.files import RequestRecord


def arrival_figures(records: Sequence[RequestRecord], sched: Schedule, wall_s: float) -> dict[str, Any]:
    """An open-loop phase's figures (docs/metrics.md#open-loop-phases): scheduled requests over the schedule's
    span (offered), successful requests over the phase's wall time (achieved), late sends and the longest delay."""
    ok_recs = [r for r in records if r.status == "ok"]
    ok = len(ok_recs)
    delays = [r.send_delay_s for r in records if r.send_delay_s is not None]
    offered = sched.offered_rps
    # completions against the schedule, both first-to-last (no tail: a phase of a few requests spends part of its
    # wall time on the last answers, which lowers achieved_rps at any rate; harness/detect/saturation.py)
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
        "queued": sum(1 for r in records if r.queued),
        "max_send_delay_s": max(delays) if delays else None,
        "e2e_from_schedule_p50_s": float(np.median(from_schedule)) if from_schedule else None,
    }


async def _stopped_first(aw: Any, stop: asyncio.Event) -> bool:
    """Wait for ``aw`` or ``stop``; True when stop came first (``aw`` is then cancelled)."""
    task = await race_stop(aw, stop)
    if task.done():
        return False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
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
                request = stream_one(
                    session,
                    engine,
                    url,
                    prompts[seq % len(prompts)],
                    params,
                    extras,
                    {**meta, "stream": 0, "index": i},
                    wall_anchor,
                    headers,
                    seq,
                )
                rec = await until_stopped(stop, request)
                scheduled = round(anchor_unix + (due_ns - anchor_ns) / 1e9, 6)
                delay = round(max(0.0, rec.start_unix_s - scheduled), 6)
                rec = dataclasses.replace(
                    rec,
                    scheduled_unix_s=scheduled,
                    send_delay_s=delay,
                    late=waited or delay > late_after_s,
                    queued=waited,
                    id=f"{rec.attempt}/0/{i}" if rec.attempt else rec.id,
                )
                records.append(rec)
                on_record(rec)
            except BaseException:
                stop.set()
                raise
            finally:
                slots.release()

        t0 = time.perf_counter_ns()
        for i, offset in enumerate(offsets_s):
            due_ns = t0 + round(float(offset) * 1e9)
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
