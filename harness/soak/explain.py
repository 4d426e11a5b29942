"""Why a verdict: the other series that moved at its onset, each against its own reference.

"acceptance 0.74 -> 0.05; at the same time KV usage 0.58 -> 0.63 and prefix-cache hit rate 0.91 -> 0.02; RSS,
queue and engine CPU unchanged". A pure function over one configuration's windows: the reference of a series is
its median over the windows of the same engine before the onset (warm-up left out), its value now the median
from the onset on. No clock, no I/O: the report and a test can rebuild an explanation from windows.jsonl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from harness.soak.figures import longest_stall


@dataclass(frozen=True)
class Series:
    label: str
    relative: float | None = None  # a move at least this share of the reference
    absolute: float | None = None  # or at least this much (for ratios near 0, counts)
    fmt: str = ".3g"


# what an explanation looks at, in the order it is told
SERIES: dict[str, Series] = {
    "output_tps": Series("output t/s", relative=0.15),
    "decode_tps": Series("decode t/s", relative=0.15),
    "alone_decode_tps": Series("decode t/s of requests alone", relative=0.15),
    "speed_index": Series("speed index", absolute=0.15, fmt=".2f"),
    "prefill_index": Series("prefill index", absolute=0.25, fmt=".2f"),
    "ttft_p95_s": Series("TTFT p95 s", relative=0.3, absolute=0.05),
    "error_ratio": Series("error share", absolute=0.05, fmt=".2f"),
    "acceptance": Series("acceptance", absolute=0.05, fmt=".2f"),
    "mean_accept_len": Series("accept length", relative=0.1, fmt=".2f"),
    "longest_stall_s": Series("longest stall s", relative=0.5, absolute=0.5),
    "kv_usage": Series("KV usage", absolute=0.05, fmt=".2f"),
    "prefix_hit_rate": Series("prefix-cache hit rate", absolute=0.1, fmt=".2f"),
    "requests_waiting": Series("queue", absolute=1.0, fmt=".0f"),
    "preemptions": Series("preemptions/window", absolute=1.0, fmt=".0f"),
    "engine_rss_mib": Series("RSS MiB", relative=0.1, fmt=".0f"),
    "engine_anon_mib": Series("anon+swap MiB", relative=0.1, fmt=".0f"),
    "prompt_cache_mib": Series("prompt cache MiB", relative=0.2, absolute=16.0, fmt=".0f"),
    "engine_cores": Series("engine CPU cores", relative=0.15, fmt=".2f"),
}


@dataclass(frozen=True)
class Move:
    metric: str
    label: str
    reference: float
    now: float
    moved: bool

    def text(self) -> str:
        f = SERIES[self.metric].fmt
        return f"{self.label} {self.reference:{f}} → {self.now:{f}}"


@dataclass(frozen=True)
class Explanation:
    metric: str
    moves: tuple[Move, ...]

    @property
    def moved(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.moved and m.metric != self.metric)

    @property
    def unchanged(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if not m.moved and m.metric != self.metric)

    def text(self) -> str:
        """One sentence: what moved with the verdict's series, and what did not."""
        parts = []
        if self.moved:
            parts.append("at the same time " + _and([m.text() for m in self.moved]))
        if self.unchanged:
            parts.append(_and([m.label for m in self.unchanged]) + " unchanged")
        return "; ".join(parts) if parts else "too few windows before its onset to compare with"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "text": self.text(), "moves": [asdict(m) for m in self.moves]}


def series_value(window: dict[str, Any], metric: str) -> float | None:
    """A window's value of an explained series (flat fields, the CPU split, the longest stall)."""
    if metric == "longest_stall_s":
        return longest_stall(window)
    v = (
        window.get("engine_cores", (window.get("cpu") or {}).get("engine_cores"))
        if metric == "engine_cores"
        else window.get(metric)
    )
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) else None


def explain(
    windows: Sequence[dict[str, Any]], onset_unix: float, metric: str, reference_windows: int = 10, now_windows: int = 3
) -> Explanation:
    """Every series in SERIES with values on both sides of ``onset_unix``: its reference (median of up to
    ``reference_windows`` windows of the onset's engine before it, after the engine's first window unless that is
    all there is) and its value
    from the onset on (median of up to ``now_windows``), and whether that is a move."""
    after = [w for w in windows if float(w.get("t_end_unix") or w.get("t_unix") or 0) > onset_unix]
    pid = after[0].get("engine_pid") if after else None
    before = [
        w
        for w in windows
        if float(w.get("t_end_unix") or w.get("t_unix") or 0) <= onset_unix
        and (pid is None or w.get("engine_pid") == pid)
    ]
    warm = [w for w in before if not w.get("engine_restart")]
    before = (warm or before)[-reference_windows:]  # the engine's first window only when there is nothing else
    after = after[:now_windows]
    moves = []
    for name, spec in SERIES.items():
        ref_vals = [v for w in before if (v := series_value(w, name)) is not None]
        now_vals = [v for w in after if (v := series_value(w, name)) is not None]
        if not ref_vals or not now_vals:
            continue
        ref, now = float(np.median(ref_vals)), float(np.median(now_vals))
        diff = abs(now - ref)
        moved = (
            spec.absolute is not None
            and diff >= spec.absolute
            and (spec.relative is None or diff >= spec.relative * abs(ref))
        ) or (spec.absolute is None and spec.relative is not None and diff >= spec.relative * abs(ref) and diff > 0)
        moves.append(Move(name, spec.label, ref, now, bool(moved)))
    return Explanation(metric, tuple(moves))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
