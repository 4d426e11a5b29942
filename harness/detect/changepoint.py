"""Collapse within minutes: a per-load-level reference and a one-sided CUSUM per watched metric.

harness/detect/trend.py asks "has this series drifted over the whole soak?"; a Mann-Kendall test over
hours of flat windows needs many windows after a step before the order looks non-random (a -30%
step after 6 h flat: 79 minutes). This module asks the other question, window by window: "did
this metric just leave its reference the bad way, and stay out?"

Per metric and per load level (the window's ``users``; one reference for every level where the rule says the load
does not move the figure, ``per_level=False``; a rule made for one kind of loop, ``loop``, sees no value in the other):

- reference: the median of the first ``reference_windows`` eligible windows at that level, and a
  robust sigma ``max(1.4826 x MAD, noise_floor, count sd)`` (the floor scaled by ``|reference|`` for
  relative rules; the count sd: the median over the reference windows of what each window's own counts
  imply, ``count_sd`` from harness/soak/windows.py, so five windows that happened to agree exactly cannot make
  one request's difference ten sigmas). An open-loop window counts towards a reference only when its
  backlog held still (``load_settled``): never the transition to a level, nor the drain of a queue a
  heavier level left. Throughput at 4 users is not throughput at 1 user: each level has its own reference, and
  a window at a level without one only helps build it. No reference is built while the metric is
  in a collapse episode (it would be a reference of the collapse). Judging starts after
  ``reference_windows`` (a window that carries its metric's prior reference, ``<metric>_prior``: the speed index's 1
  once its curve is known, is judged against it while the level has none of its own, and the level's reference is
  built from the windows not past ``refine_within x min_change`` the bad way; a collapse so judged says so, ``prior``), but the
  median and MAD go on taking in the level's judged windows outside episodes until they hold ``refine_windows``:
  five windows give a loose sigma (the MAD of five values is often far off), and a CUSUM counted in sigmas alarms on noise when its sigma is too
  small (bench/detector.py, 240 h of 10%-noise windows: 201 false alarms frozen at 5, 8 refined to 30); a
  window already past ``refine_within x min_change`` the bad way does not refine it (a collapse right after a short
  reference would become the reference, and a slowdown just short of the gate would drag it down to meet it);
- score: a one-sided CUSUM on ``z = bad_direction x (x - reference) / sigma``,
  ``S = max(0, S + min(z - allowance, threshold / confirm_windows))``, cleared by a window back within
  ``min_change / 2`` of the reference (the score weighs the current run of departing windows, not an outlier long
  past, and no window weighs more than its share of the confirmation);
- a ``collapse`` event fires when ``S >= threshold`` and the metric's last ``confirm_windows``
  judged values all depart from their level's reference by at least ``min_change`` the bad way
  (consecutive judged windows of the metric, each against its own level's reference, so a
  collapse that straddles a load change is not delayed by it). The CUSUM keeps noisy metrics
  (sigma close to min_change) from alarming on two unlucky windows; ``min_change`` keeps a
  quiet metric from alarming on a statistically clear but harmless shift;
- then the metric is in an episode: no new collapse for it until ``recover_windows`` consecutive
  judged windows are back within ``min_change / 2`` of the reference; that fires ``recovered``
  (episode start, end, worst departure), resets the metric's scores, and it can alarm again.

Windows that fall in the warm-up after an engine (re)start are skipped: neither reference nor judged. Windows that
are contaminated (other processes stole CPU), whose load level changed inside the window (``users``, or in an
open-loop soak ``load_level``, is None), whose open-loop backlog was draining (``draining``: more finished than
arrived, a queue emptying; a collapse fills the queue instead), or still held the queue an earlier, heavier level left
(``backlog_inherited``: the engine serves it at full concurrency, so its per-request figures are not the level's,
docs/detector.md) are judged only by the rules made for any load (``any_load``: the speed index, a figure already
measured against the engine's own curve at the concurrency it had), and a contaminated window refines no reference.
A window an engine pause overlapped (``paused_s``, the health probe's silence of at least the stall floor, in every
window it covered) is seen but weighs nothing here: its fall is the ``stall`` verdict's, and
a pause straddling two windows must not confirm a collapse by itself. More consecutive paused windows than
``pause_windows`` are judged as any: an engine that keeps pausing has collapsed. Pure state over window aggregates; no
clock, no I/O.

The memory headroom forecast is a Theil-Sen slope over recent RSS samples, like Prometheus's
``predict_linear`` but robust to the odd spike.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from scipy import stats

from harness.common.stats import number_or_none

MAD_TO_SIGMA = 1.4826  # MAD x this = sigma for Gaussian noise


@dataclass(frozen=True)
class MetricRule:
    bad_direction: int  # +1 rising is bad, -1 falling is bad
    min_change: (
        float  # smallest departure from the reference that can be a collapse (relative, or absolute if absolute=True)
    )
    noise_floor: float  # lower bound of the robust sigma (fraction of |reference| if relative, absolute otherwise)
    absolute: bool = False
    loop: str | None = None  # "open" or "closed": watched in open-loop (``load_level``) or closed-loop windows only
    per_level: bool = True  # False: one reference for every load level (a figure the load does not move)
    # True: judged whatever the load does (level changing, backlog draining or inherited, level not settled): a figure
    # already measured against what the engine serves at the concurrency it had (harness/soak/speed.py)
    any_load: bool = False
    # True: a window whose own count sd is wider than the level's sigma is scored in its own sigma (a window of one
    # request weighs less than one of ten: the speed index judges the sparse windows of a night's trough)
    weigh_window: bool = False
    # a judged window refines the reference only while it departs the bad way by less than this share of min_change: a
    # slowdown that reads just short of the gate must not drag its reference down to meet it (1: up to the gate)
    refine_within: float = 1.0

    def __post_init__(self) -> None:
        if self.bad_direction not in (-1, 1):
            raise ValueError(f"bad_direction is +1 or -1, not {self.bad_direction}")
        if self.loop not in (None, "open", "closed"):
            raise ValueError(f"loop is 'open', 'closed' or None, not {self.loop!r}")
        if not self.min_change > 0 or not self.noise_floor > 0:
            raise ValueError(f"min_change ({self.min_change}) and noise_floor ({self.noise_floor}) must be positive")
        if not 0 < self.refine_within <= 1:
            raise ValueError(f"refine_within ({self.refine_within}) is a share of min_change, in (0, 1]")
        if self.any_load and self.per_level:
            raise ValueError("a figure judged at any load has one reference for every level (per_level=False)")


# the speed index's rule (harness/soak/speed.py), which the prefill index's takes with a larger step
SPEED_INDEX_RULE = MetricRule(
    bad_direction=-1,
    min_change=0.2,
    noise_floor=0.02,
    per_level=False,
    any_load=True,
    weigh_window=True,
    refine_within=0.5,
)


# The window fields the collapse detector watches (docs/detector.md says why these numbers).
WATCHED_CHANGES: dict[str, MetricRule] = {
    "output_tps": MetricRule(bad_direction=-1, min_change=0.2, noise_floor=0.02),  # total output tokens/s of the window
    # median per-request decode t/s: with several closed-loop users on a CPU it swings by up to half as requests
    # take turns or get batched together (seen on llama-server here), at the same total t/s; output_tps catches smaller
    # falls. Open loop, it follows how many requests happened to share the engine (docs/detector.md#alone-decode)
    "decode_tps": MetricRule(bad_direction=-1, min_change=0.4, noise_floor=0.02, loop="closed"),
    # open loop: the median decode t/s of the window's requests that ran alone, the engine's own speed at any level
    "alone_decode_tps": MetricRule(bad_direction=-1, min_change=0.4, noise_floor=0.02, loop="open", per_level=False),
    "ttft_p95_s": MetricRule(bad_direction=+1, min_change=0.5, noise_floor=0.05),  # a p95 is noisy: a larger step
    "error_ratio": MetricRule(
        bad_direction=+1, min_change=0.1, noise_floor=0.02, absolute=True
    ),  # reference ~0: absolute
    # accepted / drafted tokens: with n-gram lookup it follows the prompts (0.14 to 1.0 a window at one level of the
    # second two-hour soak, docs/soak.md#the-second-two-hour-soak); the collapses operators report are -40% and worse
    "acceptance": MetricRule(bad_direction=-1, min_change=0.3, noise_floor=0.02),
    # the tokens streamed against what this engine streams at the concurrency each request had (harness/soak/speed.py):
    # about 1 at any load, so judged in every window whatever its load does; the two-hour soak's healthy windows went
    # down to 0.83 (median 1.06), a 30% slower engine gives 0.7 and a halved one 0.5
    "speed_index": SPEED_INDEX_RULE,
    # the first tokens' service (TTFT less the wait for a slot) predicted by this engine's prefill model over the
    # measured one (harness/soak/prefill.py): about 1 at any load. One request strays further from it than from the
    # speed curve (spread 0.22 with prompt sizes, 0.37-0.59 in the older fixtures without them), so a larger step
    "prefill_index": replace(SPEED_INDEX_RULE, min_change=0.4),
    # the engine's memory net of its prompt cache (a cache growing to its cap by design is not a collapse)
    "engine_memory_mib": MetricRule(bad_direction=+1, min_change=0.3, noise_floor=0.01),  # above warm-up growth (+15%)
}


@dataclass(frozen=True)
class DetectorSettings:
    warmup_windows: int = 2  # windows after an engine (re)start that are neither reference nor judged
    reference_windows: int = 5  # judged-eligible windows per load level that form that level's reference
    threshold: float = 5.0  # CUSUM decision interval h, in robust sigmas
    allowance: float = 1.0  # CUSUM k, in robust sigmas
    confirm_windows: int = 2  # an alarm needs this many consecutive windows past min_change
    recover_windows: int = 2  # an episode ends after this many consecutive windows back within min_change/2
    refine_windows: int = (
        30  # reference and sigma keep taking in judged windows (outside episodes) up to this many per level
    )
    pause_windows: int = (
        2  # consecutive windows an engine pause (``paused_s``) excuses: one pause shorter than a window
    )

    def __post_init__(self) -> None:
        if self.warmup_windows < 0:
            raise ValueError("warmup_windows must be >= 0")
        if self.refine_windows < self.reference_windows:
            raise ValueError("refine_windows must be >= reference_windows")
        if self.pause_windows < 0:
            raise ValueError("pause_windows must be >= 0")
        if self.reference_windows < 1 or self.confirm_windows < 1 or self.recover_windows < 1:
            raise ValueError("reference_windows, confirm_windows and recover_windows must be >= 1")
        if not self.threshold > 0 or self.allowance < 0:
            raise ValueError("threshold must be > 0 and allowance >= 0")


@dataclass(frozen=True)
class ChangeEvent:
    kind: str  # "collapse" or "recovered"
    metric: str
    level: int | None  # load level (users) the window was judged at
    t_unix: float  # the window that decided it
    onset_unix: float  # first window of the episode (the first of the confirm windows)
    reference: float
    value: float  # the deciding window's value
    relative_change: float  # (value - reference)/|reference| (absolute rules: value - reference)
    score: float  # CUSUM statistic at decision
    # the reference was the window's prior (the level had none of its own yet: the speed index against the measured
    # curve in the soak's first windows)
    prior: bool = False
    episode_start_unix: float | None = None  # "recovered" only
    episode_end_unix: float | None = None  # "recovered" only: the first of the windows back within min_change/2
    size: float | None = None  # "recovered": worst relative (or absolute) departure during the episode, signed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.prior:  # said only where it was (verdict evidence written before the prior existed has none)
            del out["prior"]
        return out


@dataclass(frozen=True)
class MetricState:
    """What the exporter shows per metric after each window."""

    reference: float | None  # at the level the metric was last judged at
    score: float  # CUSUM statistic at that level
    in_episode: bool
    relative_change: float | None  # in the last window; None when the metric was not judged in it


# ---- private mutable state (one detector per configuration, fed once per window) ------------


@dataclass(slots=True)
class _Level:
    sample: list[float] = field(default_factory=list)  # the values the reference and sigma are taken from
    sds: list[float] = field(
        default_factory=list
    )  # the same windows' count sds (relative to their value for relative rules)
    reference: float | None = None
    sigma: float | None = None
    score: float = 0.0

    def add(self, x: float, sd: float | None) -> None:
        self.sample.append(x)
        if sd is not None:
            self.sds.append(sd)

    def fit(self, rule: MetricRule) -> bool:
        """Reference and sigma from the sample; False (nothing set) when a relative rule would scale by ~0."""
        ref = float(np.median(self.sample))
        if not rule.absolute and abs(ref) < 1e-12:
            return False
        mad = float(np.median(np.abs(np.asarray(self.sample) - ref)))
        scale = 1.0 if rule.absolute else abs(ref)
        counts = float(np.median(self.sds)) * scale if self.sds else 0.0
        self.reference = ref
        self.sigma = max(MAD_TO_SIGMA * mad, rule.noise_floor * scale, counts)
        return True


@dataclass(slots=True)
class _Episode:
    start_unix: float
    worst_change: float  # signed, the largest departure the bad way so far
    back_windows: int = 0  # consecutive judged windows within min_change/2
    back_since_unix: float | None = None


@dataclass(slots=True)
class _Track:
    recent: deque[tuple[float, float]]  # (t_unix, signed change) of the last confirm_windows judged windows
    levels: dict[int | None, _Level] = field(default_factory=dict)
    episode: _Episode | None = None
    last_level: int | None = None
    judged_once: bool = False
    last_change: float | None = None  # change in the last window, None when not judged in it
    last_prior: float | None = None  # the prior the last judged window carried


_JUDGED, _BUILDING, _SETTLING, _NO_VALUE = "judged", "building reference", "load settling", "no value"


class ChangeDetector:
    """One per configuration; feeds every watched metric of each window."""

    def __init__(
        self, settings: DetectorSettings = DetectorSettings(), rules: dict[str, MetricRule] | None = None
    ) -> None:
        self.settings = settings
        self.rules: dict[str, MetricRule] = dict(WATCHED_CHANGES if rules is None else rules)
        self._tracks = {m: _Track(recent=deque(maxlen=settings.confirm_windows)) for m in self.rules}
        self._warmup_left = settings.warmup_windows  # a soak starts on a freshly started engine
        self._judged: tuple[bool, str | None] = (False, "no window yet")
        self._paused_run = 0  # consecutive judged-eligible windows an engine pause overlapped

    def engine_restarted(self) -> None:
        """Warm-up again; references, scores and episodes are kept (same configuration)."""
        self._warmup_left = self.settings.warmup_windows

    def warming_up(self) -> bool:
        """Whether the next window fed is one of the warm-up's (not judged, and nothing is learned from it)."""
        return self._warmup_left > 0

    def update(self, window: dict[str, Any]) -> list[ChangeEvent]:
        """Feed one closed window; returns the events it decided (usually none)."""
        t_unix = float(window["t_unix"])
        for tr in self._tracks.values():
            tr.last_change = None
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return self._skip("warm-up")
        # other processes took the CPU: judged only by the figures made for any load, and learned from by none (the
        # watchdog names the contamination in a collapse it confirms and only records it, harness/soak/watchdog.py)
        contaminated = bool(window.get("contaminated"))
        # the load level: ``load_level`` in an open-loop soak (the asked rate's level, harness/load/pacing.py), else
        # ``users``; None: it changed inside the window. Such a window, and one whose backlog drains or is an earlier
        # level's, is judged only by the figures made for any load (``any_load``)
        key = "load_level" if "load_level" in window else "users"
        load_why = (
            "contaminated"
            if contaminated
            else "backlog draining"
            if window.get("draining")
            else "backlog from an earlier level"
            if window.get("backlog_inherited")
            else "load level changed"
            if key in window and window[key] is None
            else None
        )
        users = window.get(key)  # absent (an old windows.jsonl): one level, None
        level = int(users) if users is not None else None
        settled = window.get("load_settled", True) is not False  # absent: closed loop, or a windows.jsonl from before
        sds = window.get("count_sd") or {}
        loop = "open" if "load_level" in window else "closed"
        # a window an engine pause overlapped is the stall verdict's: its figures fell with the pause, so it neither
        # scores, confirms, recovers nor refines (a pause straddling two windows made both "depart": CI's gauntlet,
        # 2026-12-03, an 8-s SIGSTOP was a collapse that stopped the configuration); pauses in more consecutive windows
        # than one pause can overlap are judged as any window (an engine that keeps pausing has collapsed)
        self._paused_run = self._paused_run + 1 if (window.get("paused_s") or 0) > 0 else 0
        excused = 0 < self._paused_run <= self.settings.pause_windows
        events: list[ChangeEvent] = []
        outcomes = {
            self._feed(
                m,
                rule,
                level if rule.per_level else None,
                t_unix,
                number_or_none(window.get(m), finite=True) if rule.loop in (None, loop) else None,
                _relative_sd(rule, window.get(m), sds.get(m)),
                (settled or rule.any_load) and not contaminated,
                events,
                excused,
                number_or_none(window.get(f"{m}_prior"), finite=True),
            )
            for m, rule in self.rules.items()
            if load_why is None or rule.any_load
        }
        if _JUDGED in outcomes:
            self._judged = (True, None)
        elif load_why is not None:
            self._judged = (False, load_why)
        else:
            self._judged = (False, next((o for o in (_BUILDING, _SETTLING) if o in outcomes), _NO_VALUE))
        return events

    def state(self) -> dict[str, MetricState]:
        """Per metric, at the level it was last judged at."""
        out: dict[str, MetricState] = {}
        for m, tr in self._tracks.items():
            lv = tr.levels.get(tr.last_level) if tr.judged_once else None
            out[m] = MetricState(
                # a level not yet holding its own reference was judged against the window's prior
                reference=(lv.reference if lv.reference is not None else tr.last_prior) if lv is not None else None,
                score=lv.score if lv is not None else 0.0,
                in_episode=tr.episode is not None,
                relative_change=tr.last_change,
            )
        return out

    def judged(self) -> tuple[bool, str | None]:
        """Whether the last window was judged, and why not: "warm-up", "contaminated", "backlog draining", "backlog from
        an earlier level", "load level changed", "building reference" (or "load settling": an open-loop level without a reference whose backlog has
        not held still yet), "no value" (no watched metric had one), "no window yet"."""
        return self._judged

    # ---- internals ----------------------------------------------------------------------------

    def _skip(self, why: str) -> list[ChangeEvent]:
        self._judged = (False, why)
        return []

    def _feed(
        self,
        metric: str,
        rule: MetricRule,
        level: int | None,
        t_unix: float,
        x: float | None,
        sd: float | None,
        settled: bool,
        events: list[ChangeEvent],
        excused: bool = False,
        prior_ref: float | None = None,
    ) -> str:
        if x is None:
            return _NO_VALUE
        s = self.settings
        tr = self._tracks[metric]
        lv = tr.levels.setdefault(level, _Level())
        prior = lv.reference is None or lv.sigma is None
        if prior and (prior_ref is None or (not rule.absolute and abs(prior_ref) < 1e-12)):
            if tr.episode is not None or excused:
                return _BUILDING  # a reference taken during a collapse would be a reference of the collapse
            if not settled:
                return _SETTLING
            lv.add(x, sd)
            if len(lv.sample) >= s.reference_windows and not lv.fit(rule):
                lv.sample.pop(0)  # a zero reference cannot scale a relative rule: slide on
                if len(lv.sds) > len(lv.sample):
                    lv.sds.pop(0)
            return _BUILDING
        if prior:
            assert prior_ref is not None
            ref, sigma = prior_ref, rule.noise_floor * (1.0 if rule.absolute else abs(prior_ref))
        else:
            assert lv.reference is not None and lv.sigma is not None
            ref, sigma = lv.reference, lv.sigma
        bad = rule.bad_direction
        if rule.weigh_window and sd is not None:  # ``sd`` is relative to the window's own value: back to its units
            sigma = max(sigma, sd * (1.0 if rule.absolute else abs(x)))
        change = (x - ref) / (1.0 if rule.absolute else abs(ref))
        if excused:  # seen and said (the state shows its change), weighed by the stall rule only
            tr.last_level, tr.judged_once, tr.last_change, tr.last_prior = level, True, change, prior_ref
            return _JUDGED
        # a window back within min_change/2 (the test an episode's recovery uses) clears the score: it weighs the run
        # of departing windows up to now, not one long past (a stall's window left 11 sigmas that, 14 windows later,
        # made two windows one request short a collapse: fixture gauntlet_ci)
        back = bad * change <= rule.min_change / 2
        # one window adds at most threshold / confirm_windows: a collapse is confirm_windows windows far out, not one
        # outlier and a window of noise after it (CI's gauntlet, 2026-12-03: a paused window's 87% and a -29% window
        # the canary had slowed made 5 sigmas)
        lv.score = (
            0.0
            if back
            else max(
                0.0, min(lv.score + bad * (x - ref) / sigma - s.allowance, lv.score + s.threshold / s.confirm_windows)
            )
        )
        # judged against the reference so far, then refines it (median and MAD shrug off a few outliers); a window
        # already past refine_within x min_change the bad way does not, or a collapse right after a short reference is
        # learned (a level judged against its prior takes its own reference once reference_windows such windows are in)
        if (
            tr.episode is None
            and settled
            and len(lv.sample) < s.refine_windows
            and bad * change < rule.min_change * rule.refine_within
        ):
            lv.add(x, sd)
            if len(lv.sample) >= s.reference_windows:
                lv.fit(rule)
        tr.recent.append((t_unix, change))
        tr.last_level, tr.judged_once, tr.last_change, tr.last_prior = level, True, change, prior_ref
        ep = tr.episode
        if ep is None:
            if (
                lv.score >= s.threshold
                and len(tr.recent) == s.confirm_windows
                and all(bad * c >= rule.min_change for _, c in tr.recent)
            ):
                onset = tr.recent[0][0]
                worst = max((c for _, c in tr.recent), key=lambda c: bad * c)
                tr.episode = _Episode(start_unix=onset, worst_change=worst)
                events.append(
                    ChangeEvent("collapse", metric, level, t_unix, onset, ref, x, change, lv.score, prior=prior)
                )
            return _JUDGED
        if bad * change > bad * ep.worst_change:
            ep.worst_change = change
        if back:
            if ep.back_windows == 0:
                ep.back_since_unix = t_unix
            ep.back_windows += 1
        else:
            ep.back_windows, ep.back_since_unix = 0, None
        if ep.back_windows >= s.recover_windows:
            events.append(
                ChangeEvent(
                    "recovered",
                    metric,
                    level,
                    t_unix,
                    ep.start_unix,
                    ref,
                    x,
                    change,
                    lv.score,
                    episode_start_unix=ep.start_unix,
                    episode_end_unix=ep.back_since_unix,
                    size=ep.worst_change,
                )
            )
            tr.episode = None
            for other in tr.levels.values():
                other.score = 0.0
            tr.recent.clear()
        return _JUDGED


def _relative_sd(rule: MetricRule, x: object, sd: object) -> float | None:
    """A window's count sd as the rule measures change: relative to the window's value, or absolute."""
    x, sd = number_or_none(x, finite=True), number_or_none(sd, finite=True)
    if sd is None or x is None:
        return None
    if rule.absolute:
        return sd
    return sd / abs(x) if abs(x) > 1e-12 else None


def detect_series(
    windows: list[dict[str, Any]],
    settings: DetectorSettings = DetectorSettings(),
    rules: dict[str, MetricRule] | None = None,
) -> list[ChangeEvent]:
    """Replay a whole list of windows (a finished run's windows.jsonl, one configuration's windows).

    A window with ``"engine_restart": True`` calls engine_restarted() before being fed, as the soak does live.
    Windows without that key (written before the soak recorded it) fall back on ``cpu.engine_restarted`` and
    on the first window of a new ``slice`` (each slice starts its engine). Windows of several configurations in
    one list raise ValueError: their references would mix.
    """
    configs = {w.get("config") for w in windows}
    if len(configs) > 1:
        raise ValueError(f"detect_series takes one configuration's windows, got {sorted(map(str, configs))}")
    det = ChangeDetector(settings, rules)
    events: list[ChangeEvent] = []
    prev_slice: Any = None
    for i, w in enumerate(windows):
        if "engine_restart" in w:
            restarted = bool(w["engine_restart"])
        else:
            cpu = w.get("cpu")
            restarted = (isinstance(cpu, dict) and bool(cpu.get("engine_restarted"))) or (
                i > 0 and w.get("slice") != prev_slice
            )
        if restarted:
            det.engine_restarted()
        prev_slice = w.get("slice")
        events.extend(det.update(w))
    return events


@dataclass(frozen=True)
class MemoryForecast:
    slope_mib_per_h: float
    headroom_s: (
        float | None
    )  # seconds until `available_mib` is used up at this slope; None when the slope is not positive
    n: int


def memory_forecast(
    t_unix: list[float], rss_mib: list[float], available_mib: float, min_span_s: float = 600.0
) -> MemoryForecast | None:
    """Theil-Sen slope (scipy.stats.theilslopes) over the points given (the caller passes the recent ones, e.g. the last
    30 minutes); None with fewer than 3 finite points or a span under min_span_s. Like Prometheus's predict_linear, but
    robust: one spike does not move the median of the pairwise slopes."""
    if len(t_unix) != len(rss_mib):
        raise ValueError(f"{len(t_unix)} times but {len(rss_mib)} RSS values")
    t = np.asarray(t_unix, dtype=float)
    y = np.asarray(rss_mib, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if len(y) < 3 or float(np.ptp(t)) < min_span_s:
        return None
    res = stats.theilslopes(y, (t - t.min()) / 3600.0)
    slope = float(res.slope)
    headroom = max(0.0, float(available_mib)) / (slope / 3600.0) if slope > 0 else None
    return MemoryForecast(slope_mib_per_h=slope, headroom_s=headroom, n=len(y))
