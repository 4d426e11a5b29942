"""A process and its live children, as psutil sees them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import psutil


def tree_sum(pid: int | None, of: Callable[[psutil.Process], float]) -> float:
    """``of`` summed over a process and its live children; 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for q in procs:
        with contextlib.suppress(psutil.Error):
            total += of(q)
    return total
