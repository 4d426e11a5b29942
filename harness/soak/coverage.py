"""How much of a soak the collapse detector judged: silence is a finding only beside it.

Of the windows with traffic (load offered to the engine, whether or not it served any), how many the change detector judged, per watched
metric (a metric is judged in a window when its state there has a change against its reference) and per load level
(closed-loop users, or the open-loop rate's level, named by its rate), and why the others were not (the windows'
``not_judged_why``).
Pure: read from the windows' records, so a report rebuilt from the results folder says the same as the live soak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.detect.changepoint import WATCHED_CHANGES
from harness.load.schedule import LEVEL_STEP


@dataclass(frozen=True)
class Coverage:
    windows: int  # windows with traffic
    judged: int
    not_judged: dict[str, int]  # why -> windows, most frequent first
    by_metric: dict[str, tuple[int, int]]  # metric -> (judged, windows where it had a value)
    by_level: dict[str, tuple[int, int]]  # load level -> (judged, windows)

    @property
    def share(self) -> float | None:
        return self.judged / self.windows if self.windows else None

    def cell(self) -> str:
        """'22/26 (85%)', or '–' without a window with traffic."""
        return f"{self.judged}/{self.windows} ({self.share:.0%})" if self.share is not None else "–"

    def why(self) -> str:
        """Why the others were not judged: 'warm-up 2, building reference 3', or 'none'."""
        return ", ".join(f"{k} {n}" for k, n in self.not_judged.items()) or "none"

    def sentence(self, config: str) -> str:
        def parts(d: dict[str, tuple[int, int]]) -> str:
            return ", ".join(f"{k} {j}/{n}" for k, (j, n) in d.items())

        text = f"{config}: {self.cell()} of its windows with traffic judged"
        if self.by_level:
            text += f"; by load {parts(self.by_level)}"
        if self.by_metric:
            text += f"; by metric {parts(self.by_metric)}"
        return text + (f"; not judged: {self.why()}" if self.not_judged else "")


def has_traffic(w: Mapping[str, Any]) -> bool:
    """Load was offered: closed-loop users (None: their number changed inside the window), an open-loop schedule's
    arrivals, or requests seen. A window where the engine served nothing under load counts: a collapse to zero."""
    offered = (w.get("offered_rps") or 0) > 0 if "load_level" in w else ("users" in w and w["users"] != 0)
    return offered or bool(w.get("requests") or w.get("streaming_requests") or (w.get("output_tps") or 0) > 0)


def _loop(w: Mapping[str, Any]) -> str:
    return "open" if "load_level" in w else "closed"


def _level(w: Mapping[str, Any]) -> str:
    if "load_level" in w:
        return "changing" if w["load_level"] is None else f"~{LEVEL_STEP ** int(w['load_level']):.3g} rps"
    users = w.get("users")
    return "changing" if users is None else f"{users} user" + ("s" if users != 1 else "")


def coverage(windows: Iterable[Mapping[str, Any]]) -> Coverage:
    """The coverage of one configuration's windows (windows.jsonl lines, or typed windows' dicts)."""
    busy = [w for w in windows if has_traffic(w)]
    why = Counter(str(w.get("not_judged_why") or "not said") for w in busy if not w.get("judged"))
    metrics: dict[str, tuple[int, int]] = {}
    for m, rule in WATCHED_CHANGES.items():
        # a metric counts where it had a value and its rule watches that kind of loop
        valued = [w for w in busy if isinstance(w.get(m), int | float) and rule.loop in (None, _loop(w))]
        if valued:
            seen = sum(
                1 for w in valued if ((w.get("detectors") or {}).get(m) or {}).get("relative_change") is not None
            )
            metrics[m] = (seen, len(valued))
    levels: dict[str, list[int]] = {}
    for w in busy:
        tally = levels.setdefault(_level(w), [0, 0])
        tally[0] += bool(w.get("judged"))
        tally[1] += 1
    return Coverage(
        windows=len(busy),
        judged=sum(1 for w in busy if w.get("judged")),
        not_judged=dict(why.most_common()),
        by_metric=metrics,
        by_level={k: (j, n) for k, (j, n) in levels.items()},
    )
