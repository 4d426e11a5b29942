"""Where a run is and how long it has left, from the plan's own model (harness/scenario.wall_clock_estimate),
corrected as phases finish: the measured phases left are scaled by how long the finished ones took against the
plan; the soak is exact. The estimate's error at the end goes into the manifest, so the plan's model can be checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from harness.config.estimate import describe_duration, wall_clock_estimate
from harness.config.schema import Scenario


@dataclass
class Progress:
    planned: dict[str, float]
    phases_total: int
    phases_done: int = 0
    soak_done_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    _phases_done_here: int = 0  # finished by this process (a resumed run's earlier phases took another's time)

    @property
    def resumed(self) -> bool:
        """Phases were done before this process: its elapsed time is not the run's, and the error says less."""
        return self.phases_done > self._phases_done_here

    @classmethod
    def of(cls, sc: Scenario, done_phases: int = 0) -> Progress:
        m = sc.measurement
        loads = len(m.arrival.keys()) if m.arrival is not None else len(m.streams)
        return cls(wall_clock_estimate(sc), max(1, len(sc.runs()) * m.repetitions * loads), phases_done=done_phases)

    def phase_done(self) -> None:
        self.phases_done += 1
        self._phases_done_here += 1

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def left_s(self) -> float:
        """Seconds still to go: the measured phases left at the pace of those finished here (the plan's pace before
        any), the other parts as planned, the soak's remaining seconds."""
        p = self.planned
        measure_left = p["measurement_s"] * (self.phases_total - self.phases_done) / self.phases_total
        per_phase_plan = p["measurement_s"] / self.phases_total
        if self._phases_done_here:
            pace = (self.elapsed_s() - self.soak_done_s) / (self._phases_done_here * per_phase_plan)
            measure_left *= min(10.0, max(0.1, pace))
        return max(
            0.0,
            measure_left
            + p["ramp_s"]
            + p["fill_check_s"]
            + max(0.0, p["soak_s"] - self.soak_done_s)
            + p["after_soak_s"],
        )

    def line(self, where: str) -> str:
        return (
            f"  [{where}] {describe_duration(self.elapsed_s())} elapsed, about {describe_duration(self.left_s())} left "
            f"({self.phases_done}/{self.phases_total} phases)"
        )

    def record(self) -> dict[str, Any]:
        """The estimate against what happened, for the manifest (``estimate``)."""
        actual = self.elapsed_s()
        planned = self.planned["total_s"]
        return {
            "planned_s": round(planned, 1),
            "actual_s": round(actual, 1),
            "error": round(actual / planned - 1.0, 3) if planned > 0 else None,
            "parts_planned_s": self.planned,
        }
