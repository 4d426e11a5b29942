"""Locust workers on other hosts (soak.remote_workers): their clocks, their shares, and who was lost. No locust import.

A remote worker shares no disk and no clock with the harness: the master (on the harness's host) sends it the slice's
config, the worker measures its clock against the master's (``clock_offset``) and ships its records back with every
unix time moved to the master's clock (``to_master_clock``); the master keeps a ``WorkerBook`` and writes what happened
to each worker to ``soak/workers/<slice>.jsonl``. Definitions: docs/fleet.md#locust-workers-on-other-hosts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from harness.load.schedule import worker_share

# the record fields that hold a unix time (harness/records/files.py RequestRecord)
UNIX_FIELDS = ("start_unix_s", "scheduled_unix_s")
# what a worker may name a file it sends the master (the master writes it as <slice>-<name>)
FILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,120}\.(pacing\.json|exhausted)$")


def clock_offset(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, round trip) of a worker's clock from ping samples ``(sent, master_time, received)``: the sample with
    the shortest round trip, its master time taken as the midpoint (NTP's estimate; error at most half that round
    trip). ``offset`` = worker clock − master clock."""
    if not samples:
        raise ValueError("no clock sample")
    sent, master, received = min(samples, key=lambda s: s[2] - s[0])
    return (sent + received) / 2.0 - master, received - sent


def to_master_clock(rec: dict[str, Any], offset_s: float) -> dict[str, Any]:
    """A worker's record with its unix times on the master's clock (``offset_s`` from ``clock_offset``)."""
    out = dict(rec)
    for key in UNIX_FIELDS:
        if out.get(key) is not None:
            out[key] = round(float(out[key]) - offset_s, 6)
    return out


def safe_host(name: str) -> str:
    """A host name as it may appear in a file name."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", name)[:60] or "host"


@dataclass
class WorkerState:
    """One remote worker as the master saw it over a slice."""

    client_id: str
    index: int
    host: str
    pid: int
    clock_offset_s: float
    rtt_s: float
    joined_unix: float
    scheduled: int | None = None  # open loop: the arrivals of its share
    sent: int = 0  # records it shipped
    failed: int = 0  # of those, not ok
    last_seen_unix: float | None = None  # its last message (records, files) to the master
    lost_unix: float | None = None  # when the master found it gone while the load ran

    @property
    def name(self) -> str:
        return f"{safe_host(self.host)}-{self.pid}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class WorkerBook:
    """The master's account of its remote workers: who joined, what each shipped, who went missing (once each)."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerState] = {}

    def joined(self, client_id: str, hello: dict[str, Any], t_unix: float) -> WorkerState:
        w = WorkerState(
            client_id=client_id,
            index=int(hello["index"]),
            host=str(hello["host"]),
            pid=int(hello["pid"]),
            clock_offset_s=float(hello["clock_offset_s"]),
            rtt_s=float(hello["rtt_s"]),
            joined_unix=t_unix,
            last_seen_unix=t_unix,
        )
        self.workers[client_id] = w
        return w

    def shipped(self, client_id: str, records: Iterable[dict[str, Any]], t_unix: float) -> None:
        w = self.workers.get(client_id)
        if w is None:
            return
        w.last_seen_unix = t_unix
        for r in records:
            w.sent += 1
            w.failed += r.get("status") != "ok"

    def pacing(self, client_id: str, scheduled: int) -> None:
        if (w := self.workers.get(client_id)) is not None:
            w.scheduled = scheduled

    def missing(self, present: Iterable[str], t_unix: float) -> list[WorkerState]:
        """The workers that joined, are not among ``present`` and were not found lost before: now lost."""
        here = set(present)
        lost = [w for cid, w in self.workers.items() if cid not in here and w.lost_unix is None]
        for w in lost:
            w.lost_unix = t_unix
        return lost

    def summary(self) -> list[dict[str, Any]]:
        return [w.to_dict() for w in sorted(self.workers.values(), key=lambda w: w.index)]


def lost_arrivals(schedule: np.ndarray, index: int, total: int, after_s: float) -> np.ndarray:
    """Which of a slice's scheduled arrivals (soak seconds) a worker lost at ``after_s`` will never send: its share
    (``worker_share``) from then on. A boolean mask over ``schedule``."""
    mask = np.zeros(len(schedule), dtype=bool)
    mine = worker_share(len(schedule), index, total)
    mask[mine[schedule[mine] >= after_s]] = True
    return mask
