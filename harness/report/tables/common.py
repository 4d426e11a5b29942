"""What the table families share: a configuration as run, a number or None."""

from __future__ import annotations

from typing import Any

from harness.common.stats import isnum
from harness.report.load import RunData


def config_spec(run: RunData, name: str) -> dict[str, Any]:
    """The configuration as run: the manifest's expanded copy (sweeps expanded), else the scenario's."""
    spec = ((run.manifest.get("configurations") or {}).get(name) or {}).get("spec")
    if spec:
        return dict(spec)
    for c in run.scenario.get("configurations") or []:
        if c.get("name") == name:
            return dict(c)
    return {}


def as_float(v: Any) -> float | None:
    """A real number as float; None for anything else (None, NaN, a boolean, text)."""
    return float(v) if isnum(v) else None
