"""The error tree shared by the engine adapters and the harness, and the CLI exit codes it maps to.

It lives with the adapters so that ``engines`` imports nothing from ``harness``; the harness
re-exports every name from ``harness.common.errors``, where its own errors (scenario, results) join it.

Exit codes (README): 0 ok, 1 a verdict failed, 2 bad input, 3 engine or infrastructure failure,
4 a soak failed (a configuration crashed, hung, gave up, collapsed or ran out of memory during its soak).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_VERDICT = 1
EXIT_INPUT = 2
EXIT_ENGINE = 3
EXIT_SOAK = 4


class HarnessError(Exception):
    """Base of every error the harness raises on purpose; carries its CLI exit code."""

    exit_code = EXIT_ENGINE


class EngineError(HarnessError):
    """The engine did not do what a configuration asked."""

    exit_code = EXIT_ENGINE


class EngineNotInstalled(EngineError):
    """The engine's program is not on this machine; the message says how to install it."""


class EngineStartError(EngineError):
    """The engine exited, or never became ready, during start-up."""


class SpeculationInactive(EngineError):
    """The engine serves, but without the speculation the configuration asked for."""


class EngineCrashed(EngineError):
    """The engine process exited while serving."""


class EngineHung(EngineError):
    """The engine stopped answering within the allowed time."""


class ScrapeError(EngineError):
    """The engine's /metrics (or /slots) could not be read or parsed."""
