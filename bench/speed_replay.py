"""The speed and prefill indices rebuilt over every committed real soak that kept its request records (tests/fixtures/soak_records),
through the path the live soak runs (harness.soak.assemble.replay_speed: the window assembly's speed figures, then the
change detector), beside the windows as they were judged when the soak ran.

    .venv/bin/python -m bench.speed_replay

Prints, per fixture and configuration: each index's range and median, the windows with traffic judged then and now,
and each index's change events. Figures in docs/detector.md#speed-index and #prefill-index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.config.schema import Watchdog
from harness.detect.changepoint import ChangeDetector, detect_series
from harness.soak.assemble import detector_states, replay_speed
from harness.soak.coverage import coverage
from harness.soak.slice import SETTLE_WINDOWS, detector_settings

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "soak_records"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rejudged(wd: Watchdog, windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows with the judgement the slice writes (judged, why not, per-metric state), the detector fed them as
    they are (replay_speed judges the windows it rebuilds itself)."""
    det, out = ChangeDetector(detector_settings(wd)), []
    for w in windows:
        if w.get("engine_restart"):
            det.engine_restarted()
        det.update(w)
        judged, why = det.judged()
        out.append({**w, "judged": judged, "not_judged_why": why, "detectors": detector_states(det)})
    return out


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {float(np.median(values)):.2f} / {max(values):.2f}" if values else "–"


def main() -> None:
    print(
        "| fixture | config | windows | judged then | judged now | speed index min / median / max | speed index events"
        " | prefill index min / median / max | prefill index events |"
    )
    print("|---|---|---:|---:|---:|---|---|---|---|")
    for folder in sorted(p for p in RECORDS.iterdir() if (p / "requests.jsonl").exists()):
        sc = yaml.safe_load((folder / "scenario.yaml").read_text())
        wd = Watchdog(**sc["soak"]["watchdog"])
        windows, recs = _read(folder / "windows.jsonl"), _read(folder / "requests.jsonl")
        settings = detector_settings(wd)
        for config in dict.fromkeys(w["config"] for w in windows):
            mine = [w for w in windows if w["config"] == config]
            rebuilt = replay_speed(
                mine,
                [r for r in recs if r.get("config", config) == config],
                settings,
                SETTLE_WINDOWS * wd.window_s,
                slots=int(sc["server"].get("parallel", 1)),
            )
            found = detect_series(rebuilt, settings)
            cells = []
            for metric in ("speed_index", "prefill_index"):
                events = [
                    f"{e.kind} {e.relative_change:+.0%} at window "
                    f"{next(i for i, w in enumerate(mine) if w['t_unix'] == e.t_unix)}"
                    for e in found
                    if e.metric == metric
                ]
                values = [w[metric] for w in rebuilt if w.get(metric) is not None]
                cells += [_spread(values), "; ".join(events) or "none"]
            then, now = coverage(mine), coverage(rebuilt)  # replay_speed judged them
            print(f"| {folder.name} | {config} | {len(mine)} | {then.cell()} | {now.cell()} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
