"""A finished run folder -> its series in OpenMetrics text, timestamped, for promtool backfill:

    specsoak export RUN_DIR --openmetrics --out run.om
    promtool tsdb create-blocks-from openmetrics run.om DATA_DIR

The records are replayed, in time order, into the live exporter's own metrics (harness/metrics/
exporter.py), so a backfilled run has exactly the names and labels a live one has and the same
dashboards show it. After each record every sample that changed is written with the record's time
(a request's end, a phase's end, a failure's time), and every series again each ``step_s``. What only a live run knows is absent: the
engine's RSS and the engine's own /metrics. The engine counts as up from its start to its end.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engines.types import Capacity
from harness.metrics.exporter import MetricsExporter
from harness.records.files import (
    FAILURES,
    PHASES,
    REQUESTS,
    VERDICTS,
    WINDOWS,
    RequestRecord,
    read_jsonl,
    read_manifest,
)
from harness.records.types import Failure, Manifest, Phase, SoakWindow, Verdict
from harness.soak.canary import CANARY, round_summaries

SKIP_SUFFIXES = ("_created", "_gsum", "_gcount")
Labels = tuple[tuple[str, str], ...]
T = TypeVar("T")


@dataclass
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _typed(lines: Iterable[dict[str, Any]], parse: Callable[[dict[str, Any]], T]) -> list[T]:
    """Each line as its typed record; a line without a field its record requires is left out of the replay."""
    out = []
    for line in lines:
        try:
            out.append(parse(line))
        except (ValueError, TypeError):
            continue
    return out


def _events(run_dir: Path) -> tuple[Manifest, list[tuple[float, int, str, Any]]]:
    manifest = read_manifest(run_dir)
    requests = _typed(read_jsonl(run_dir / REQUESTS), RequestRecord.from_dict)
    phases = _typed(read_jsonl(run_dir / PHASES), Phase.from_dict)
    failures = _typed(read_jsonl(run_dir / FAILURES), Failure.from_dict)
    # the soak's windows and verdicts (hundreds per configuration); its per-request records are not replayed
    windows = _typed(read_jsonl(run_dir / WINDOWS), SoakWindow.from_dict)
    verdict_lines = list(read_jsonl(run_dir / VERDICTS))
    verdicts = _typed(verdict_lines, Verdict.from_dict)
    events: list[tuple[float, int, str, Any]] = []  # (time, order, kind, payload)
    t_run = float(manifest.started_unix or 0.0)
    for seq, (name, info) in enumerate(manifest.configurations.items()):
        times = [float(r.start_unix_s) for r in requests if r.config == name and r.start_unix_s]
        times += [float(f.unix_s) for f in failures if f.config == name and f.unix_s]
        if not times:
            continue  # never started
        cap: dict[str, Any] = {}
        with contextlib.suppress(OSError, json.JSONDecodeError):
            cap = json.loads((run_dir / "capacity" / f"{name}.json").read_text(encoding="utf-8"))
        capacity = None
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            capacity = Capacity.from_dict(cap) if isinstance(cap, dict) and cap else None
        ready_s = float(cap.get("ready_s") or 0.0) if capacity is not None else 0.0
        first = min(times)
        start = max(t_run, first - ready_s - 0.001)
        ends = [float(r.start_unix_s) + float(r.e2e_s or 0.0) for r in requests if r.config == name]
        ends += [float(p.end_unix_s) for p in phases if p.config == name and p.end_unix_s]
        ends += [float(w.t_end_unix) for w in windows if w.config == name and w.t_end_unix]
        ends += [float(v.t_unix) for v in verdicts if v.config == name and v.t_unix]
        ends += times
        events.append((start, 0, "config_start", (name, info, seq)))
        if capacity is not None:
            events.append((min(first, start + ready_s), 1, "capacity", (name, capacity, cap.get("ready_s"))))
        events.append((max(ends) + 0.001, 9, "config_end", (name, info.status or "done")))
    events.extend((float(r.start_unix_s) + float(r.e2e_s or 0.0), 2, "request", r) for r in requests)
    events.extend((float(p.end_unix_s or p.start_unix_s or 0.0), 3, "phase", p) for p in phases)
    events.extend((float(f.unix_s or 0.0), 4, "failure", f) for f in failures)
    events.extend((float(w.t_end_unix or w.t_unix or 0.0), 5, "window", w) for w in windows)
    events.extend((float(v.t_unix or 0.0), 6, "verdict", v) for v in verdicts)
    events.extend(
        (float(c.t_unix), 7, "canary", c) for c in round_summaries(read_jsonl(run_dir / CANARY), verdict_lines)
    )
    events.sort(key=lambda e: (e[0], e[1]))
    return manifest, events


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def export_openmetrics(run_dir: Path, step_s: float = 15.0) -> str:
    """The run's series; every series is also repeated each ``step_s`` so panels draw lines, not dots."""
    manifest, events = _events(run_dir)
    if events and step_s > 0:
        t, end = events[0][0], events[-1][0]
        while t < end:
            t += step_s
            events.append((min(t, end), 10, "tick", None))
        events.sort(key=lambda e: (e[0], e[1]))
    clock = _Clock(float(manifest.started_unix or (events[0][0] if events else 0.0)))
    exp = MetricsExporter(process_reader=None, clock=clock)
    meta: dict[str, tuple[str, str]] = {}  # family -> (type, help)
    # family -> metric (its labels without "le") -> points [t_ms, [(sample, labels, value), ...]]
    series: dict[str, dict[Labels, list[list[Any]]]] = {}
    last: dict[tuple[str, Labels], tuple[Any, ...]] = {}

    def snapshot(t: float, every: bool = False) -> None:
        """Write each metric whose value changed (all of them when ``every``), every sample of it:
        an OpenMetrics histogram point holds all its buckets, its count and its sum."""
        t_ms = round(t * 1000)
        for fam in exp.registry.collect():
            meta.setdefault(fam.name, (fam.type, fam.documentation))
            groups: dict[Labels, list[tuple[str, Labels, float]]] = {}
            for smp in fam.samples:
                if smp.name.endswith(SKIP_SUFFIXES):
                    continue
                labels = tuple(sorted(smp.labels.items()))
                group = tuple(kv for kv in labels if kv[0] != "le")
                groups.setdefault(group, []).append((smp.name, labels, smp.value))
            for group, samples in groups.items():
                state = tuple(samples)
                if not every and last.get((fam.name, group)) == state:
                    continue
                last[(fam.name, group)] = state
                points = series.setdefault(fam.name, {}).setdefault(group, [])
                if points and points[-1][0] >= t_ms:
                    points[-1][1] = samples  # same millisecond: the later record wins
                else:
                    points.append([t_ms, samples])

    clock.now = float(manifest.started_unix or clock.now)
    exp.on_run_start(manifest)
    snapshot(clock.now)
    for t, _order, kind, payload in events:
        clock.now = t
        if kind == "config_start":
            name, info, _seq = payload
            exp.on_config_start(
                name,
                str(info.algorithm or "none"),
                bool(info.synthetic),
                str(manifest.engine or ""),
                "",
                None,
            )
        elif kind == "capacity":
            exp.on_capacity(*payload)
        elif kind == "request":
            exp.on_request(payload)
        elif kind == "phase":
            exp.on_phase(payload)
        elif kind == "failure":
            exp.on_failure(payload)
        elif kind == "window":
            exp.on_window(payload)
        elif kind == "verdict":
            exp.on_verdict(payload)
        elif kind == "canary":
            exp.on_canary(payload)
        elif kind == "config_end":
            exp.on_config_end(*payload)
        snapshot(t, every=kind == "tick")

    lines: list[str] = []
    for fam, metrics in series.items():
        mtype, help_text = meta[fam]
        lines.append(f"# TYPE {fam} {mtype}")
        lines.append(f"# HELP {fam} {_escape(help_text)}")
        for _group, points in sorted(metrics.items()):
            for t_ms, samples in points:
                for sample, labels, v in samples:
                    lab = "{" + ",".join(f'{k}="{_escape(val)}"' for k, val in labels) + "}" if labels else ""
                    lines.append(f"{sample}{lab} {_value(v)} {t_ms / 1000:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
