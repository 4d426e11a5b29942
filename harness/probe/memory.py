"""Memory of the engine's and the harness's processes: resident, anonymous and swapped (/proc/PID/status)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.probe.process import tree_sum


def rss_bytes(pid: int) -> int | None:
    """Resident set size of one process in bytes, or None when it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def tree_rss_bytes(pid: int | None) -> int:
    """Resident memory of a process and its live children (the fill check's peak RSS); 0 if it is gone."""
    return int(tree_sum(pid, lambda q: q.memory_info().rss))


@dataclass(frozen=True)
class TreeMemory:
    """A process tree's memory as operators meet it: resident, and anonymous (resident + swapped out).

    A leak written once and never read again is swapped out: RSS stays flat while RssAnon + VmSwap grows."""

    rss_mib: float
    anon_mib: float | None  # RssAnon + VmSwap; None where /proc/PID/status does not say
    swap_mib: float | None

    @property
    def held_mib(self) -> float:
        """The larger of resident and anonymous + swapped: what the headroom forecast watches."""
        return max(self.rss_mib, self.anon_mib or 0.0)


def status_kib(text: str, key: str) -> int | None:
    """A ``key:  N kB`` field of a /proc/PID/status text, in KiB (None when absent)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            parts = value.split()
            return int(parts[0]) if parts and parts[0].isdigit() else None
    return None


def tree_memory(pid: int | None, proc_root: Path = Path("/proc")) -> TreeMemory | None:
    """RSS, RssAnon + VmSwap and VmSwap of a process and its live children, from /proc/PID/status; None if it is gone."""
    if pid is None:
        return None
    try:
        p = psutil.Process(pid)
        pids = [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return None
    rss = anon = swap = 0
    known = False
    for q in pids:
        try:
            text = (proc_root / str(q) / "status").read_text()
        except OSError:
            continue
        r, a, w = status_kib(text, "VmRSS"), status_kib(text, "RssAnon"), status_kib(text, "VmSwap")
        rss += r or 0
        if a is not None:
            known = True
            anon += a + (w or 0)
            swap += w or 0
    if rss == 0 and not known:
        return None
    return TreeMemory(
        rss_mib=rss / 1024, anon_mib=anon / 1024 if known else None, swap_mib=swap / 1024 if known else None
    )
