"""The fault ledger: what the suite injected, what the harness did, and the figures of ``make test``.

A test that injects a fault says so (``fault_log.inject(...)``) before it does, and says what the
harness did (``.detected(...)``) once its assertions passed; a fault whose test fails stays
injected but not detected. At the end of the session the figures are printed (faults injected,
faults detected and classified, runs completed, samples lost), the rows are merged into
``docs/reliability.json`` (a row per fault, the latest result of the test that owns it) and
``docs/reliability.md`` is written from that file. ``python -m tests.faults.ledger`` rewrites the
markdown from the JSON alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "docs" / "reliability.json"
DOC = REPO / "docs" / "reliability.md"
AREAS = ("request", "engine", "harness", "input", "security")
# the document's hand-written sections (the fuzzing figures) follow this line; rewriting keeps them
KEEP = "<!-- written by hand, not generated: tests/faults/ledger.py keeps this line and everything below it -->"


@dataclass
class Fault:
    area: str  # request | engine | harness | input | security
    fault: str  # what was done to the harness
    how: str  # how the suite did it
    expected: str  # what the harness must do
    test: str = ""
    observed: str = ""  # what the harness did
    detected: bool = False
    runs_completed: int = 0  # runs (CLI or run_streams) that ended on their own with the expected status
    samples_lost: int = 0  # records that were on disk, or sent, and are not in the results

    def done(self, observed: str, runs_completed: int = 0, samples_lost: int = 0) -> None:
        self.observed = observed
        self.runs_completed = runs_completed
        self.samples_lost = samples_lost
        self.detected = samples_lost == 0


class FaultLog:
    """What one test hands to the ledger."""

    def __init__(self, rows: list[Fault], test: str):
        self._rows = rows
        self._test = test

    def inject(self, area: str, fault: str, how: str, expected: str) -> Fault:
        assert area in AREAS, area
        row = Fault(area, fault, how, expected, test=self._test)
        self._rows.append(row)
        return row


_ROWS = pytest.StashKey[list[Fault]]()


@pytest.fixture
def fault_log(request: pytest.FixtureRequest) -> Iterator[FaultLog]:
    rows = request.config.stash.setdefault(_ROWS, [])
    return FaultLog(rows, request.node.nodeid)


def figures(rows: list[Fault]) -> dict[str, int]:
    return {
        "faults injected": len(rows),
        "faults detected and classified": sum(r.detected for r in rows),
        "runs completed": sum(r.runs_completed for r in rows),
        "samples lost": sum(r.samples_lost for r in rows),
    }


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    f = figures(rows)
    terminalreporter.section("specsoak reliability (docs/reliability.md)")
    terminalreporter.write_line(", ".join(f"{k}: {v}" for k, v in f.items()))
    missed = [r for r in rows if not r.detected]
    for r in missed:
        terminalreporter.write_line(f"NOT DETECTED: {r.area}: {r.fault} ({r.test})", red=True)
    try:
        merged = merge(load(DATA), rows)
        save(DATA, merged)
        DOC.write_text(markdown(merged) + kept(DOC), encoding="utf-8")
    except OSError as exc:  # a read-only checkout still prints the figures
        terminalreporter.write_line(f"docs/reliability.md not written: {exc}")


def load(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return list(data.get("faults", []))


def save(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"faults": rows}, indent=1) + "\n", encoding="utf-8")


def merge(old: list[dict[str, Any]], new: list[Fault]) -> list[dict[str, Any]]:
    """The latest result per (area, fault); rows of tests not run this time are kept as they were."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    fresh = {(r.area, r.fault): {**asdict(r), "date": stamp} for r in new}
    ran = {r.test for r in new}
    kept = [r for r in old if (r["area"], r["fault"]) not in fresh and r.get("test") not in ran]
    out = kept + list(fresh.values())
    return sorted(out, key=lambda r: (AREAS.index(r["area"]) if r["area"] in AREAS else 99, r["test"], r["fault"]))


def kept(path: Path) -> str:
    """The hand-written part of ``path``, from the KEEP line to the end ("" when it has none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    at = text.find(KEEP)
    return "\n" + text[at:] if at >= 0 else ""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[dict[str, Any]]) -> str:
    total = {
        "faults injected": len(rows),
        "faults detected and classified": sum(bool(r["detected"]) for r in rows),
        "runs completed": sum(int(r["runs_completed"]) for r in rows),
        "samples lost": sum(int(r["samples_lost"]) for r in rows),
    }
    out = [
        "# Reliability: the faults the suite injects and what the harness does",
        "",
        "<!-- generated by tests/faults/ledger.py from docs/reliability.json at the end of `make test`; do not edit -->",
        "",
        "Every row is a fault a test injected into a real run (the real llama-server, the real client,",
        "the real CLI), what the harness must do, and what it did. A row whose test failed reads",
        "**NOT DETECTED**. Figures over the table: " + ", ".join(f"{k} **{v}**" for k, v in total.items()) + ".",
        "",
        "Rules the rows rely on:",
        "",
        "- A failed request is a record with `status: error` and an `error_kind` (docs/metrics.md), never a fast",
        "  success: a stream that ends without a finish is `truncated`; more text chunks than the engine's",
        "  `usage.completion_tokens` is `duplicate` (one chunk carries at least one token, so the extra chunks",
        "  were repeated; such a request counts no tokens).",
        "- SIGTERM or SIGINT during a phase: no new request starts, the requests in flight are cut and",
        "  recorded with `error_kind: interrupted`, the phase gets no phase record (a resume measures it",
        "  again), the engine is stopped, the manifest says `interrupted` and why; exit code 143 (130 for",
        "  SIGINT). A second signal stops at once. Between phases, the first signal does the same.",
        "- A records write that fails (disk full) stops the run the same way, exit code 3; the run folder keeps",
        "  a 64 KiB reserve that is given back so the manifest's stop reason can still be written.",
        "- The CLI runs with the user's umask plus 022: nothing it creates is group- or world-writable.",
        "- An API key is read from the environment variable `server.api_key_env` names, handed to llama-server",
        "  in its environment (`LLAMA_API_KEY`, never on the command line) and sent as `Authorization: Bearer`.",
        "",
        "| area | fault injected | how | the harness must | it did | result | test |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = "detected" if r["detected"] else "**NOT DETECTED**"
        test = r["test"].split("::")[0].rsplit("/", 1)[-1] + "::" + r["test"].split("::")[-1]
        out.append(
            f"| {r['area']} | {_cell(r['fault'])} | {_cell(r['how'])} | {_cell(r['expected'])} | "
            f"{_cell(r['observed'])} | {result} | `{_cell(test)}` |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    rows = load(DATA)
    if not rows:
        sys.exit(f"{DATA}: no rows; run the suite first")
    DOC.write_text(markdown(rows) + kept(DOC), encoding="utf-8")
    print(DOC)
