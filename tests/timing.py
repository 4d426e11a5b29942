"""Where the suite's minutes go: seconds, tests and engine starts per test file.

A pytest plugin (registered by tests/conftest.py) that sums each test's setup, call and teardown by file (a module
fixture's start-up counts against the file whose first test needed it), counts the engines the file started (every
launch appends a line to the ledger named by ``SPECSOAK_ENGINE_LEDGER``, engines/process.py, subprocesses included),
prints the table at the end of the run and, with ``--times-json PATH``, writes it for docs/testing.md:
``python -m tests.timing .test-times/*.json`` merges the groups into the markdown table kept there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

LEDGER_ENV = "SPECSOAK_ENGINE_LEDGER"


@dataclass
class FileTime:
    file: str
    tests: int = 0
    seconds: float = 0.0
    engine_starts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


def _ledger_lines(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


class Timing:
    """Per-file totals from the test reports (on the xdist controller too: workers' reports reach it)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.files: dict[str, FileTime] = {}
        self.t0 = time.perf_counter()
        out = config.getoption("times_json")
        self.out = Path(out) if out else None
        ledger = os.environ.get(LEDGER_ENV)
        if ledger is None and not hasattr(config, "workerinput"):
            base = self.out.parent if self.out else Path(config.rootpath) / ".test-times"
            base.mkdir(parents=True, exist_ok=True)
            ledger = str(base / f"engine-starts-{os.getpid()}.jsonl")
            Path(ledger).write_text("")
            os.environ[LEDGER_ENV] = ledger  # engines started by the tests and by their subprocesses append here
        self.ledger = Path(ledger) if ledger else None
        self.seen = _ledger_lines(self.ledger)

    def _entry(self, nodeid: str) -> FileTime:
        name = nodeid.split("::", 1)[0]
        return self.files.setdefault(name, FileTime(name))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self._entry(report.nodeid)
        entry.seconds += report.duration
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            entry.tests += 1
            entry.outcomes[report.outcome] = entry.outcomes.get(report.outcome, 0) + 1
        if report.when == "teardown":
            now = _ledger_lines(self.ledger)
            entry.engine_starts += now - self.seen
            self.seen = now

    def rows(self) -> list[FileTime]:
        return sorted(self.files.values(), key=lambda r: -r.seconds)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput") or not self.files:
            return
        wall = time.perf_counter() - self.t0
        rows = self.rows()
        tr = terminalreporter
        tr.section("seconds per test file (setup + call + teardown; engines started)")
        for line in table(rows, wall):
            tr.write_line(line)
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "args": self.config.invocation_params.args,
                "workers": getattr(self.config.option, "numprocesses", None),
                "wall_s": round(wall, 1),
                "files": [asdict(r) | {"seconds": round(r.seconds, 1)} for r in rows],
            }
            self.out.write_text(json.dumps(doc, indent=1) + "\n")
            tr.write_line(f"per-file times written to {self.out}")


def table(rows: Iterable[FileTime], wall_s: float | None = None) -> list[str]:
    rows = list(rows)
    total = sum(r.seconds for r in rows) or 1.0
    lines = [f"{'seconds':>8} {'share':>6} {'tests':>5} {'engines':>7}  file"]
    lines += [f"{r.seconds:8.1f} {r.seconds / total:6.1%} {r.tests:5d} {r.engine_starts:7d}  {r.file}" for r in rows]
    summed = f"{sum(r.seconds for r in rows):8.1f} {'':6} {sum(r.tests for r in rows):5d} "
    summed += f"{sum(r.engine_starts for r in rows):7d}  (sum of tests)"
    lines.append(summed)
    if wall_s is not None:
        lines.append(f"{wall_s:8.1f} {'':6} {'':5} {'':7}  (wall clock of this pytest run)")
    return lines


def markdown(docs: list[dict[str, Any]]) -> str:
    """One markdown table over several runs' JSON (e.g. the parallel unit group and the serial engine group)."""
    out = ["| file | tests | seconds | engine starts | group |", "|---|---:|---:|---:|---|"]
    for doc in docs:
        group = " ".join(doc["args"])
        out += [
            f"| `{r['file']}` | {r['tests']} | {r['seconds']:.0f} | {r['engine_starts']} | {group} |"
            for r in doc["files"]
        ]
    out += [f"\nwall clock of `pytest {' '.join(doc['args'])}`: {doc['wall_s']:.0f} s" for doc in docs]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown([json.loads(Path(p).read_text()) for p in sys.argv[1:]]))
