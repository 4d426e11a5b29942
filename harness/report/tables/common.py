"""What the table families share: a configuration as run, a number or None."""

from __future__ import annotations

from typing import Any

from harness.records.types import ConfigState
from harness.report.load import RunData


def config_spec(run: RunData, name: str) -> dict[str, Any]:
    """The configuration as run: the manifest's expanded copy (sweeps expanded), else the scenario's."""
    spec = (run.manifest.configurations.get(name) or ConfigState()).spec
    if spec:
        return dict(spec)
    for c in run.scenario.get("configurations") or []:
        if c.get("name") == name:
            return dict(c)
    return {}
