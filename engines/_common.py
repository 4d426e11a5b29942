"""Helpers shared by the adapters of server engines written in Python/Rust (vLLM, SGLang, TRT-LLM, TGI).

Nothing here knows an engine's names; each adapter passes its own. Formats: in each adapter.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from engines.errors import ScrapeError
from engines.types import EngineCounters

GIB = 1024.0  # MiB per GiB
MAX_POSITIONS = 1024  # draft positions a per-position counter may have: a larger label is not a position


def gib_mib(value: str | float) -> float:
    """GiB (vLLM, TRT-LLM, and SGLang, whose 'GB' are torch's 2^30-byte units) -> MiB."""
    return round(float(str(value).replace(",", "")) * GIB, 3)


def to_int(text: str) -> int:
    """'34,952' -> 34952."""
    return int(text.replace(",", "").replace("_", ""))


class Samples:
    """One /metrics scrape: every sample summed over its label sets, and per-label breakdowns."""

    def __init__(self, text: str, engine: str):
        self.engine = engine
        self.totals: dict[str, float] = defaultdict(float)
        self.by_label: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    value = float(sample.value)  # the parser gives integers as int: 1e400 does not fit a float
                    self.totals[sample.name] += value
                    for label, label_value in sample.labels.items():
                        self.by_label[(sample.name, label)][label_value] += value
        except (ValueError, TypeError, OverflowError) as exc:
            raise ScrapeError(f"{engine}: /metrics is not valid Prometheus text: {exc}") from exc

    def get(self, *names: str) -> float | None:
        """The first of ``names`` present (engines renamed their counters between versions)."""
        for name in names:
            if name in self.totals:
                return self.totals[name]
        return None

    def per_label(self, name: str, label: str) -> tuple[float, ...]:
        """Values of ``name`` ordered by the integer value of ``label`` (positions 0, 1, ...)."""
        d = self.by_label.get((name, label))
        if not d:
            return ()
        idx: dict[int, float] = {}
        for k, v in d.items():
            if re.fullmatch(r"-?[0-9]+", k):
                if len(k) > 5 or int(k) >= MAX_POSITIONS:
                    raise ScrapeError(
                        f'{self.engine}: /metrics: {name}{{{label}="{k[:20]}"}} is not a draft position (0 to {MAX_POSITIONS - 1})'
                    )
                idx[int(k)] = v
        return tuple(idx.get(i, 0.0) for i in range(max(idx) + 1)) if idx else ()


# Python exception lines at the start of a line, after an optional "(EngineCore_DP0 pid=7) " or "[... TP0] "
_PY_EXC = re.compile(r"^\s*(?:\([^)]*\)\s*)?(?:\[[^\]]*\]\s*)?((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")


def python_exception(text: str, generic: tuple[str, ...] = ()) -> str | None:
    """The root Python exception of a log ('ValueError: ...'): the first one whose message is not one
    of the engine's ``generic`` wrappers ('Engine core initialization failed'), else the last one."""
    found: list[str] = []
    for line in text.splitlines():
        m = _PY_EXC.match(line.rstrip())
        if m:
            found.append(f"{m.group(1)}: {m.group(2).strip()}")
    specific = [f for f in found if not any(g in f for g in generic)]
    if specific:
        return specific[0]
    return found[-1] if found else None


def python_with(module: str, binary: Path | None) -> str | None:
    """The Python interpreter to run ``python -m module`` with: the scenario's, else this one if it has it."""
    if binary is not None:
        return str(binary)
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        return sys.executable
    return None


def which(name: str, binary: Path | None) -> str | None:
    if binary is not None:
        return str(binary)
    return shutil.which(name)


def is_python(binary: Path | None) -> bool:
    return binary is not None and re.fullmatch(r"python[0-9.]*", binary.name) is not None


def dist_version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def has_arg(args: tuple[str, ...], *flags: str) -> bool:
    """True when the user's extra arguments already set one of ``flags`` (``--x v`` or ``--x=v``)."""
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


def classify_context_overflow(status: int, body: str, phrases: tuple[str, ...]) -> str | None:
    low = body.lower()
    if status in (400, 413, 422, 500) and any(p in low for p in phrases):
        return "context_overflow"
    return None


def for_configuration(c: EngineCounters, speculative: bool, draft_per_step: int | None) -> EngineCounters:
    """The counters of one scrape as this configuration means them.

    Without speculation the speculative fields are None (engines that derive accepted tokens from
    output tokens would otherwise report a baseline's every token as 'accepted'). With a fixed
    draft length per verification step (chain drafting of K tokens), drafted tokens are
    ``verify_steps * K`` when the engine has no drafted-tokens counter.
    """
    if not speculative:
        return dataclasses.replace(
            c, draft_tokens=None, accepted_tokens=None, verify_steps=None, accepted_per_position=()
        )
    if c.draft_tokens is None and draft_per_step and c.verify_steps is not None:
        return dataclasses.replace(c, draft_tokens=c.verify_steps * draft_per_step)
    return c
