"""One verdict from a campaign's folders (issue #34, docs/fleet.md): the measure part's ratios, each configuration's
soak column from the part that soaked it, and the hardware each figure was measured on.

A part's manifest says what it ran (``part``: ``specsoak run --no-soak`` or ``--soak-config``, harness/config/parts.py).
Folders form one campaign when every one is a part of the same scenario file and exactly one of them is the measure
part. A speed ratio is never taken across folders: each ratio is the measure part's, both sides on its node. A soak
part measures its configuration again on its own node (the before side of its after-soak comparison); those ratios
stay in its folder and are not put beside the measure part's, since their hardware may differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from harness.report.load import RunData


@dataclass(frozen=True)
class Hardware:
    node: str  # the machine's hostname (a pod's is its name: the node is in the scrape's labels)
    cpu: str
    gpus: tuple[str, ...]  # device names from the run's phase records; () on a CPU run

    def label(self) -> str:
        gpu = ", ".join(self.gpus) if self.gpus else "no GPU"
        return f"{self.node} ({self.cpu}; {gpu})"


def hardware_of(run: RunData) -> Hardware:
    mach = run.manifest.machine
    gpus: tuple[str, ...] = ()
    if not run.phases.empty and "gpu" in run.phases:
        for g in run.phases["gpu"]:
            if isinstance(g, dict) and g.get("available") and g.get("devices"):
                gpus = tuple(str(d.get("name")) for d in g["devices"] if isinstance(d, dict))
                break
    return Hardware(str(mach.get("hostname") or "?"), str(mach.get("cpu_model") or "?"), gpus)


@dataclass(frozen=True)
class Campaign:
    of: str  # the scenario file the parts came from
    measure: RunData
    soaks: dict[str, RunData]  # configuration -> the part that soaked it


def campaign_of(runs: Sequence[RunData]) -> Campaign | None:
    """The campaign these folders are, or None: not every folder a part of one scenario file, not exactly one
    measure part, or a configuration soaked by two parts (then each folder is reported as its own run)."""
    parts = [r.manifest.part for r in runs]
    if len(runs) < 2 or any(not isinstance(p, dict) for p in parts):
        return None
    if len({p["of"] for p in parts if isinstance(p, dict)}) != 1:
        return None
    measure = [r for r in runs if isinstance(r.manifest.part, dict) and not r.manifest.part.get("soak")]
    if len(measure) != 1:
        return None
    soaks: dict[str, RunData] = {}
    for r in runs:
        part = r.manifest.part
        if r is measure[0] or not isinstance(part, dict):
            continue
        for name in part.get("soak_configs") or []:
            if name in soaks:
                return None
            soaks[str(name)] = r
    return Campaign(str(parts[0]["of"]) if isinstance(parts[0], dict) else "?", measure[0], soaks)


def merge_verdict(verdict: pd.DataFrame, campaign: Campaign) -> pd.DataFrame:
    """The measure part's rows, each with the soak cell of the part that soaked its configuration (empty where none
    did), ``measured_on`` and ``soaked_on`` naming the hardware."""
    measure_id = campaign.measure.run_id
    rows = verdict[verdict["run"] == measure_id].copy()
    by_key = {
        (str(r), str(c)): cell
        for r, c, cell in zip(
            verdict["run"], verdict["config"], verdict.get("soak", pd.Series([None] * len(verdict))), strict=True
        )
    }
    measured_on = hardware_of(campaign.measure).label()
    soak_cells: list[str] = []
    soaked_on: list[str | None] = []
    for name in rows["config"]:
        part = campaign.soaks.get(str(name))
        if part is None:  # not soaked: an empty cell, as in a single run's table
            soak_cells.append("")
            soaked_on.append(None)
            continue
        cell = by_key.get((part.run_id, str(name)))
        soak_cells.append(cell if isinstance(cell, str) and cell else "–")
        soaked_on.append(f"{hardware_of(part).label()} (run {part.run_id})")
    rows["soak"] = soak_cells
    rows["measured_on"] = measured_on
    rows["soaked_on"] = soaked_on
    return rows.reset_index(drop=True)


def campaign_notes(campaign: Campaign) -> list[str]:
    """What the merged table took from where, and where the soak parts' hardware differs from the measure part's."""
    m_hw = hardware_of(campaign.measure)
    notes = [
        f"One campaign of `{campaign.of}`: every speed ratio is from the measure part (run `{campaign.measure.run_id}`, "
        f"on {m_hw.label()}), both sides on that hardware; the soak column is each configuration's own soak part."
    ]
    for name, part in sorted(campaign.soaks.items()):
        hw = hardware_of(part)
        if (hw.cpu, hw.gpus) != (m_hw.cpu, m_hw.gpus):
            notes.append(
                f"`{name}` soaked on other hardware ({hw.label()}): its soak and before/after figures are that "
                f"node's, and no ratio is taken between them and the measure part's."
            )
    return notes
