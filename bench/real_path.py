"""Soaks simulated request by request, judged through the path the live soak runs (issue #33, item 6).

    .venv/bin/python -m bench.real_path                  # the table in docs/detector.md#the-real-path
    .venv/bin/python -m bench.real_path --seeds 3        # a quicker look

**The engine** is learned from a committed real soak (tests/fixtures/soak_records/alone_2h: llama-server, SmolLM2 on
this 2-core VM, two hours of open-loop traffic): its curve (one stream's decode rate while k streams decode, and the
stall of every stream while a prompt is processed) is ``harness.soak.speed.SpeedModel`` fitted on all its records,
and each simulated request draws a real request of that soak: its output tokens, its speed against that curve (the
noise of real requests, bootstrapped), and the time to first token of a request that ran alone (its prompt's
processing). Slots as the scenario's ``parallel``; a request beyond them waits in the engine's queue; prompts are
processed one at a time, every stream stalled meanwhile; the machine's speed swings by ``DRIFT`` over 20 minutes (this
VM drifts by about that). A plant multiplies the engine's speed from its instant on.

**The load** comes from the soak's own code: open-loop arrivals from ``harness.load.schedule.soak_offsets`` (the
schedule Locust sends, ``max_in_flight`` holding back and recording late sends), closed-loop users from
``harness.load.shapes.users_at``.

**The judgement** is the slice's (harness/soak/slice.py): each window's ``live_window``, then, once its requests have
ended (SETTLE_WINDOWS later), ``settle_window`` over the records that had arrived by then (traffic, backlog, the
requests that ran alone, the speed index with its model learning as the slice's does), the change detector, the
``judged_window`` record and the watchdog's ``judge``: every verdict the live soak would give, with its action.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.schema import Watchdog
from harness.detect.changepoint import ChangeDetector
from harness.load.pacing import window_traffic
from harness.load.schedule import LATE_AFTER_S, soak_offsets
from harness.load.shapes import users_at
from harness.records.types import SoakWindow
from harness.soak.assemble import detector_states, judged_window, live_window, settle_window
from harness.soak.coverage import coverage
from harness.soak.slice import SETTLE_WINDOWS, detector_settings
from harness.soak.speed import SpeedModel, span_of, spans_of
from harness.soak.watchdog import WatchState, judge
from harness.soak.windows import Backlog, end_unix, outstanding, take_ended

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "soak_records"
T0 = 1_800_000_000.0
DT = 0.02  # simulation step, seconds
DRIFT = 0.08  # the machine's speed swings +-8% over DRIFT_PERIOD_S
DRIFT_PERIOD_S = 1200.0
DRAIN_S = 600.0  # after the soak's last send, its requests may still end for this long


@dataclass(frozen=True)
class Engine:
    """A simulated llama-server learned from a real soak's records."""

    t1_tps: float  # one stream alone
    beta: float  # k streams decode at t1 * k**beta in all
    slots: int
    tokens: np.ndarray  # per real request: its output tokens
    speed: np.ndarray  # its tokens over what the curve predicts for its span (the real requests' noise)
    prefill_s: np.ndarray  # times to first token of the real requests that ran alone (a prompt's processing)
    source: str

    def capacity_rps(self) -> float:
        """Requests a second the engine serves at most: its total rate does not grow past t1 x slots**beta, and a
        prompt stalls every stream while it is processed."""
        total = self.t1_tps * self.slots**self.beta
        return 1.0 / (float(np.mean(self.tokens)) / total + float(np.mean(self.prefill_s)))


def learned_engine(fixture: str = "alone_2h", config: str = "baseline", slots: int = 4) -> Engine:
    """The engine of ``fixture``'s ``config``: the speed model fitted on all its request records at once, each
    request's speed against it, and the TTFT of those that started with nothing else in flight."""
    path = RECORDS / fixture / "requests.jsonl"
    recs = [
        r
        for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
        if r.get("config", config) == config and r.get("status") == "ok"
    ]
    spans = spans_of(recs)
    t_lo, t_hi = min(s.start for s in spans), max(s.end for s in spans)
    model = SpeedModel()
    model.learn(spans, t_lo, t_hi)
    assert model.t1 is not None
    # each request's tokens over what the curve predicts for the concurrency it had (prompt stalls excluded: rho)
    ratios, tokens = [], []
    for s in spans:
        others = [o for o in spans if o is not s and o.end > s.first and o.start < s.end]
        cuts = sorted({s.first, s.end, *(x for o in others for x in (o.start, o.first, o.end) if s.first < x < s.end)})
        edges = np.asarray(cuts)
        mids = (edges[:-1] + edges[1:]) / 2
        k = np.ones(len(mids), dtype=int) + sum(((mids >= o.first) & (mids < o.end)).astype(int) for o in others)
        p = np.zeros(len(mids), dtype=bool)
        for o in others:
            p |= (mids >= o.start) & (mids < o.first)
        predicted = float((np.diff(edges) * model.rate(k, p)).sum())
        if predicted > 1.0:  # not a request the curve gives under a token (one decoding beside prompts throughout)
            ratios.append(min(2.0, max(0.5, s.tokens / predicted)))
            tokens.append(int(s.tokens) + 1)
    alone = [
        s.first - s.start for s in spans if not any(o is not s and o.end > s.start and o.start < s.first for o in spans)
    ]
    return Engine(
        model.t1,
        model.beta,
        slots,
        np.asarray(tokens),
        np.asarray(ratios),
        np.asarray(alone),
        f"{fixture}/{config}: t1 {model.t1:.1f} t/s, beta {model.beta:.2f}, rho {model.rho:.2f}, "
        f"{len(ratios)} requests (speed sd {float(np.std(ratios)):.2f}), {len(alone)} alone",
    )


@dataclass(frozen=True)
class Load:
    """Open loop (``arrival``: a soak.arrival mapping) or closed (``shape``: a soak.shape mapping)."""

    name: str
    arrival: dict[str, Any] | None = None
    shape: dict[str, Any] | None = None


@dataclass(frozen=True)
class Plant:
    at_s: float
    factor: float  # the engine's speed from then on (0.5: halved)
    where: str


@dataclass
class _Req:
    sent: float
    scheduled: float | None
    tokens: int
    speed: float
    prefill_left: float
    user: int | None = None
    first: float | None = None
    done: float = 0.0
    times: list[float] = field(default_factory=list)


def simulate(
    engine: Engine, load: Load, seconds: float, seed: int, plant: Plant | None = None
) -> tuple[list[dict[str, Any]], np.ndarray | None]:
    """The soak's request records (as the Locust user writes them) and, open loop, its schedule (soak seconds)."""
    rng = np.random.default_rng(seed)
    phase = float(rng.uniform(0, 2 * math.pi))
    sched = None
    if load.arrival is not None:
        sched = soak_offsets({**load.arrival, "seed": seed}, 0.0, seconds, seconds)
    max_in_flight = int((load.arrival or {}).get("max_in_flight", 64))
    nxt, held = 0, deque[float]()  # the next scheduled arrival; those due but held back by max_in_flight
    users_next: dict[int, float] = {}  # closed loop: a user's next send
    busy: set[int] = set()  # closed loop: the users whose request is in flight
    queue: deque[_Req] = deque()
    active: list[_Req] = []  # in a slot: prefilling (first None) or decoding
    out: list[dict[str, Any]] = []
    t = 0.0

    def draw(sent: float, scheduled: float | None, user: int | None = None) -> _Req:
        i = int(rng.integers(len(engine.tokens)))
        pre = float(engine.prefill_s[int(rng.integers(len(engine.prefill_s)))])
        return _Req(sent, scheduled, int(engine.tokens[i]), float(engine.speed[i]), pre, user)

    while t < seconds + DRAIN_S:
        in_flight = len(queue) + len(active)
        if t < seconds:
            if sched is not None:
                while nxt < len(sched) and sched[nxt] <= t:
                    held.append(float(sched[nxt]))
                    nxt += 1
                while held and in_flight < max_in_flight:
                    queue.append(draw(t, held.popleft()))
                    in_flight += 1
            else:
                assert load.shape is not None
                n = users_at(load.shape, t, seconds)
                for u in range(n):
                    if u not in busy and users_next.setdefault(u, t) <= t:
                        queue.append(draw(t, None, u))
                        busy.add(u)
                        del users_next[u]
        elif not queue and not active:
            break
        while queue and len(active) < engine.slots:
            active.append(queue.popleft())
        speed = (plant.factor if plant is not None and t >= plant.at_s else 1.0) * (
            1.0 + DRIFT * math.sin(2 * math.pi * t / DRIFT_PERIOD_S + phase)
        )
        prefilling = next((r for r in active if r.first is None), None)
        if prefilling is not None:  # one prompt at a time, every stream stalled meanwhile
            prefilling.prefill_left -= DT * speed
            if prefilling.prefill_left <= 0:
                prefilling.first = t + DT
                prefilling.done = 1.0
                prefilling.times.append(t + DT)
        else:
            decoding = [r for r in active if r.first is not None]
            k = len(decoding)
            for r in decoding:
                step = DT * speed * r.speed * engine.t1_tps * k**engine.beta / k
                before, r.done = r.done, min(float(r.tokens), r.done + step)
                for m in range(int(before) + 1, int(r.done) + 1):
                    r.times.append(t + DT * (m - before) / step)
        t += DT
        for r in [r for r in active if r.first is not None and r.done >= r.tokens]:
            active.remove(r)
            out.append(_record(r))
            if r.user is not None:
                busy.discard(r.user)
                users_next[r.user] = t + 0.05
    return out, sched


def _record(r: _Req) -> dict[str, Any]:
    assert r.first is not None
    end = r.times[-1]
    itl = np.diff(r.times).tolist()
    return {
        "config": "sim",
        "status": "ok",
        "start_unix_s": T0 + r.sent,
        "ttft_s": r.first - r.sent,
        "e2e_s": end - r.sent,
        "output_tokens": r.tokens,
        "chunks": r.tokens,
        "itl_s": itl,
        "decode_tps": (r.tokens - 1) / (end - r.first) if end > r.first else None,
        "scheduled_unix_s": T0 + r.scheduled if r.scheduled is not None else None,
        "send_delay_s": r.sent - r.scheduled if r.scheduled is not None else 0.0,
        "late": (r.sent - r.scheduled > LATE_AFTER_S) if r.scheduled is not None else None,
    }


@dataclass(frozen=True)
class Judged:
    windows: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]  # kind, metric, action, t_unix (when judged: SETTLE_WINDOWS after the window)


MEASURE_STREAMS = (1, 4)  # the measurement's default streams, up to the simulated engine's slots
MEASURE_S = 60.0  # each phase's length: past the live default's 2 requests a stream, as the 10 its curve needs


def measured(engine: Engine, seed: int) -> list[dict[str, Any]]:
    """The configuration's measurement phases on its fresh engine before the soak (``phase: measure``, closed loop at
    each of MEASURE_STREAMS), as ``SpeedModel.from_phases`` takes them: the curve the soak's first window is judged on."""
    out = []
    for streams in MEASURE_STREAMS:
        load = Load(f"measure-{streams}", shape={"kind": "steady", "users": streams})
        recs, _ = simulate(engine, load, MEASURE_S, seed * 1000 + streams)
        out += [{**r, "phase": "measure", "streams": streams, "repetition": 1, "attempt": f"m{streams}"} for r in recs]
    return out


def judge_soak(
    recs: list[dict[str, Any]],
    load: Load,
    sched: np.ndarray | None,
    seconds: float,
    wd: Watchdog,
    phases: Sequence[dict[str, Any]] = (),
) -> Judged:
    """The windows and verdicts the live soak gives on these records, window by window as the slice builds them;
    ``phases``: the measurement's records, where the live campaign starts the curve (none: learned from the soak)."""
    ws = wd.window_s
    n_windows = math.ceil(seconds / ws)
    det, state = ChangeDetector(detector_settings(wd)), WatchState()
    model, backlog = SpeedModel.from_phases(phases), Backlog()
    history: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    by_end = sorted(recs, key=end_unix)
    ends = [end_unix(r) for r in by_end]
    taken: set[int] = set()
    open_loop = load.arrival is not None
    for i in range(n_windows):
        t0, t1 = T0 + i * ws, T0 + (i + 1) * ws
        settle = T0 + min(i + 1 + SETTLE_WINDOWS, n_windows) * ws  # when the slice settles it
        last = i == n_windows - 1
        arrived = [r for r in by_end if end_unix(r) < settle or last]
        unassigned = [r for r in arrived if id(r) not in taken]
        ended, streaming = take_ended(unassigned, t1, last)
        taken.update(id(r) for r in ended)
        users = None
        if load.shape is not None:
            u0, u1 = users_at(load.shape, i * ws, seconds), users_at(load.shape, (i + 1) * ws - 1e-6, seconds)
            users = u0 if u0 == u1 else None
        win = live_window(
            config="sim",
            slice_id="sim-s001",
            t0=t0,
            t1=t1,
            delta=None,
            memory={"engine_rss_mib": 600.0, "engine_memory_mib": 600.0},
            probe_latencies_s=[0.01],
            users=users,
            engine_pid=1,
            engine_uptime_s=(i + 1) * ws,
            engine_restart=i == 0,
            harness_rss_mib=200.0,
            machine_memory_available_mib=4000.0,
            gpu={},
            cpu=None,
            cpu_engine_restarted=False,
            contamination_cores=0.05,
        )
        if open_loop:
            assert load.arrival is not None and sched is not None
            traffic = window_traffic(
                ended, ws, (None, None, None), load.arrival, sched, (i * ws, min((i + 1) * ws, seconds)), seconds
            )
            out_end = outstanding(sched, 0.0, min((i + 1) * ws, seconds), ends, t1)
        else:
            traffic, out_end = window_traffic(ended, ws, (None, None, None)), None
        seen = [r for r in arrived if end_unix(r) >= t0 - 600.0]
        win = settle_window(
            win,
            ended,
            streaming,
            history[-1] if history else None,
            None,
            traffic,
            open_loop,
            out_end,
            backlog,
            [(float(r["start_unix_s"]), end_unix(r)) for r in seen],
            [],
            [s for r in seen if (s := span_of(r)) is not None],
            model,
            wd.reference_windows,
            det.warming_up() or i == 0,
        )
        if i == 0:
            det.engine_restarted()
        events = det.update(win)
        judged, why = det.judged()
        record = judged_window(win, judged, why, detector_states(det), (None, None), (None, None)).to_dict()
        history.append(record)
        backlog.add(record)
        verdicts.extend(
            {"kind": f.kind, "metric": f.metric, "action": f.action, "t_unix": settle, "window": i, "why": f.message}
            for f in judge(SoakWindow.from_dict(record), history, wd, state, events, None, open_loop)
        )
    return Judged(history, verdicts)


# the four shapes of issue #33's unplanted soaks, as shares of the engine's capacity; 40 minutes each
def shapes(cap: float, seconds: float) -> dict[str, Load]:
    q = seconds / 4
    return {
        "staged, one level overloaded": Load(
            "staged",
            arrival={
                "kind": "poisson",
                "max_in_flight": 4,
                "stages": [
                    {"rate_rps": 0.4 * cap, "duration_s": q},
                    {"rate_rps": 0.75 * cap, "duration_s": q},
                    {"rate_rps": 1.2 * cap, "duration_s": q},
                    {"rate_rps": 0.5 * cap, "duration_s": q},
                ],
            },
        ),
        "diurnal, bursty gamma (cv 2)": Load(
            "diurnal",
            arrival={
                "kind": "gamma",
                "cv": 2.0,
                "curve": "diurnal",
                "rate_rps": 0.9 * cap,
                "trough_rps": 0.15 * cap,
                "max_in_flight": 4,
            },
        ),
        "steady near capacity": Load("steady", arrival={"kind": "poisson", "rate_rps": 0.85 * cap, "max_in_flight": 4}),
        "closed-loop ramp, 1 -> 4 users": Load("ramp", shape={"kind": "ramp", "start_users": 1, "users": 4}),
    }


def plants(seconds: float) -> dict[str, list[Plant]]:
    """Per shape, where a slowdown is planted: at the light level, at the busiest, across a level change, at the
    diurnal peak, mid-ramp; 50% and 30%."""
    q = seconds / 4
    return {
        "staged": [
            Plant(3.6 * q, 0.5, "light level"),  # the last stage's, once the overloaded stage's queue has drained
            Plant(q, 0.5, "across a level change"),
            Plant(1.6 * q, 0.5, "busiest served level"),
            Plant(1.6 * q, 0.7, "busiest served level, 30%"),
        ],
        "diurnal": [Plant(seconds / 2, 0.5, "diurnal peak"), Plant(seconds / 2, 0.7, "diurnal peak, 30%")],
        "steady": [Plant(seconds / 2, 0.5, "steady near capacity")],
        "ramp": [Plant(seconds / 2, 0.5, "mid-ramp"), Plant(seconds / 2, 0.7, "mid-ramp, 30%")],
    }


WATCHDOG = Watchdog(window_s=60, warmup_windows=3, reference_windows=5, confirm_windows=2, min_requests=5)


@dataclass(frozen=True)
class Row:
    shape: str
    plant: str
    seeds: int
    false_verdicts: list[str]  # before the plant (or anywhere, unplanted), "kind metric"
    delays_min: list[float]  # plant to the first collapse judged, per seed that gave one after it
    missed: int
    judged_share: list[float]  # windows with traffic judged after the warm-up, per seed
    worst_level_share: list[float]  # the lowest share judged at one load level, per seed
    findings: list[str]  # overload and other recorded findings (not failures)


def run_row(
    engine: Engine,
    load: Load,
    seconds: float,
    seeds: Sequence[int],
    plant: Plant | None,
    wd: Watchdog = WATCHDOG,
    phases: bool = True,
) -> Row:
    false, delays, missed, share, worst, findings = [], [], 0, [], [], []
    for seed in seeds:
        recs, sched = simulate(engine, load, seconds, seed, plant)
        got = judge_soak(recs, load, sched, seconds, wd, measured(engine, seed) if phases else ())
        onset = T0 + plant.at_s if plant is not None else math.inf
        for v in got.verdicts:
            if v["kind"] == "overload":
                findings.append(f"overload ({v['action']})")
            elif v["t_unix"] < onset + wd.window_s:  # judged before a window after the plant could say so
                false.append(f"{v['kind']} {v['metric'] or ''}".strip())
        if plant is not None:
            after = [v for v in got.verdicts if v["kind"] == "collapse" and v["t_unix"] >= onset]
            if after:
                delays.append((after[0]["t_unix"] - onset) / 60.0)
            else:
                missed += 1
        cov = coverage(got.windows[wd.warmup_windows :])  # after the engine's warm-up
        if cov.share is not None:
            share.append(cov.share)
            levels = [j / n for lv, (j, n) in cov.by_level.items() if n >= 3]
            worst.append(min(levels) if levels else cov.share)
    return Row(load.name, plant.where if plant else "none", len(seeds), false, delays, missed, share, worst, findings)


def _spread(xs: list[float], fmt: str, worst: Any = max) -> str:
    return f"{fmt.format(float(np.median(xs)))} / {fmt.format(worst(xs))}" if xs else "–"


def table_row(label: str, row: Row) -> str:
    planted = row.plant != "none"
    false = f"{len(row.false_verdicts)}" + (
        f" ({', '.join(sorted(set(row.false_verdicts)))})" if row.false_verdicts else ""
    )
    return (
        f"| {label} | {row.plant} | {row.seeds} | {false} | "
        f"{_spread(row.delays_min, '{:.1f}') if planted else '–'} | {row.missed if planted else '–'} | "
        f"{_spread(row.judged_share, '{:.0%}', min)} | {_spread(row.worst_level_share, '{:.0%}', min)} | "
        f"{len(row.findings)} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=40.0)
    ap.add_argument("--no-phases", action="store_true", help="learn the curve from the soak alone, not the measurement")
    args = ap.parse_args(argv)
    engine = learned_engine()
    seconds = args.minutes * 60.0
    cap = engine.capacity_rps()
    print(f"engine learned from {engine.source}; capacity about {cap:.3f} rps at {engine.slots} slots", flush=True)
    print(
        "| shape | plant | seeds | false verdicts | collapse after the plant, min (median / worst) | missed | "
        "judged after the warm-up (median / worst seed) | worst load level judged (median / worst seed) | "
        "overload findings |"
    )
    print("|---|---|---:|---|---|---:|---|---|---:|")
    for label, load in shapes(cap, seconds).items():
        for plant in [None, *plants(seconds)[load.name]]:
            row = run_row(engine, load, seconds, range(args.seeds), plant, phases=not args.no_phases)
            print(table_row(label, row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
