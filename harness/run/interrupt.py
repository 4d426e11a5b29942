"""SIGTERM/SIGINT during a run: between phases the run stops at once; during a phase the requests in flight are cut
(recorded as 'interrupted') and the run stops after it (docs/reliability.md)."""

from __future__ import annotations

import asyncio


class RunInterrupted(BaseException):
    """SIGTERM/SIGINT: finish cleanly, stop the engine, write the stop reason."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


class PhaseInterruption:
    """The running phase's event loop and stop event, and the signal that cut it (None until one does)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.signame: str | None = None

    def cut(self, signame: str) -> bool:
        """Stop the phase in flight from a signal handler; False when no phase runs or one was cut already."""
        loop, stop = self.loop, self.stop
        if loop is None or stop is None or self.signame is not None:
            return False
        self.signame = signame
        loop.call_soon_threadsafe(stop.set)
        return True
