"""The soak watchdog's verdicts: their kinds, what each does by default, and which make a soak fail.

The one list of verdict kinds: the soak, the report and the tests import it from here.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

VerdictKind = Literal[
    "crash",
    "hang",
    "collapse",
    "memory",
    "error_rate",
    "drift",
    "no_load",
    "stall",
    "cache_cap",
    "divergence",
    "disk",
    "overload",
    "worker_lost",
]
VerdictAction = Literal["record", "restart", "stop_config", "stop_run"]
VERDICT_KINDS: tuple[str, ...] = get_args(VerdictKind)
# what each watchdog verdict does unless the scenario says otherwise (docs/soak.md)
DEFAULT_ACTIONS: dict[str, str] = {
    "crash": "restart",
    "hang": "restart",
    "collapse": "stop_config",
    "memory": "stop_config",
    "error_rate": "record",
    "drift": "record",
    "no_load": "record",
    "stall": "record",
    "cache_cap": "record",
    "divergence": "stop_config",
    "disk": "stop_run",
    "overload": "record",  # offered more than it serves: a finding about the rate (a rate it served before: collapse)
    "worker_lost": "record",  # a remote Locust worker gone mid-slice: its arrivals are not sent, and the soak says so
}


ENGINE_FAILURES = ("crash", "hang", "restart_failed", "gave_up")  # the engine itself failed: always a failed soak
SERVICE_FAILURES = ("collapse", "memory", "divergence")  # the engine served badly: a failed soak unless set to 'record'
# shown in red, and reported to the observers as failures of the configuration (verdict_fails decides which make the
# soak fail: the verdict table, exit code 4)
FAILURE_KINDS = (*ENGINE_FAILURES, *SERVICE_FAILURES)
# every kind a soak writes to verdicts.jsonl: the scenario's kinds, the watchdog's own outcomes of a restart, and the
# change detector's end of a collapse episode (the exporter labels these; anything else is "other")
RECORDED_VERDICT_KINDS: tuple[str, ...] = (*VERDICT_KINDS, "restart_failed", "gave_up", "recovered")
# the kinds a soak timeline marks: a change in service, or the engine gone
DRAWN_VERDICT_KINDS = ("collapse", "stall", "divergence", "memory", "crash", "hang")


def verdict_fails(verdict: dict[str, Any]) -> bool:
    """Whether a watchdog verdict makes its configuration's soak a failure (exit code 4): the engine failed, a
    collapse or memory verdict that was acted on (not set to 'record'), or any verdict that stopped the soak."""
    kind, action = verdict.get("kind"), verdict.get("action")
    return (
        kind in ENGINE_FAILURES
        or (kind in SERVICE_FAILURES and action != "record")
        or action in ("stop_config", "stop_run")
    )
