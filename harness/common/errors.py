"""The harness's error tree and the exit codes the CLI maps them to.

The engine errors and the base class live in engines/errors.py (the adapters raise them and must
not import the harness); they are re-exported here, so ``from harness.common.errors import ...`` names
the whole tree. Exit codes (README): 0 ok, 1 a verdict failed, 2 bad input, 3 engine or
infrastructure failure, 4 a soak failed (a configuration crashed, hung, gave up, collapsed or ran
out of memory during its soak).
"""

from __future__ import annotations

from engines.errors import (
    EXIT_ENGINE,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_SOAK,
    EXIT_VERDICT,
    EngineCrashed,
    EngineError,
    EngineHung,
    EngineNotInstalled,
    EngineStartError,
    HarnessError,
    ScrapeError,
    SpeculationInactive,
)

__all__ = [
    "EXIT_ENGINE",
    "EXIT_INPUT",
    "EXIT_OK",
    "EXIT_SOAK",
    "EXIT_VERDICT",
    "EngineCrashed",
    "EngineError",
    "EngineHung",
    "EngineNotInstalled",
    "EngineStartError",
    "HarnessError",
    "ResultsError",
    "ScenarioError",
    "ScrapeError",
    "SpeculationInactive",
]


class ScenarioError(HarnessError):
    """A scenario file (or a file it names) is wrong. Nothing has been started."""

    exit_code = EXIT_INPUT


class ResultsError(HarnessError):
    """A results folder cannot be read or written (missing, not writable, disk full)."""

    exit_code = EXIT_ENGINE
