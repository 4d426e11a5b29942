"""The machine's memory bandwidth, measured once per run: the ceiling of memory-bound decoding.

A numpy copy of an array far larger than the caches reads it once and writes it once, so one
copy moves ``2 × size`` bytes. The best of a few repetitions is kept (the least disturbed one);
the figure is single-threaded, like a numpy copy, and is written into ``manifest.json`` under
``machine.memory_bandwidth`` (docs/metrics.md#explanation).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def measure_bandwidth(size_mib: int = 256, repeats: int = 5) -> dict[str, Any]:
    """Copy ``size_mib`` MiB ``repeats`` times; the best GB/s (10^9 bytes per second) and how it was measured."""
    try:
        src = np.ones(size_mib * 2**20 // 8, dtype=np.float64)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault the pages in before timing
        best_s = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            np.copyto(dst, src)
            best_s = min(best_s, (time.perf_counter_ns() - t0) / 1e9)
        moved = 2 * src.nbytes
        return {
            "method": "numpy copy, best of repeats",
            "size_mib": size_mib,
            "repeats": repeats,
            "bytes_per_copy": moved,
            "best_s": best_s,
            "gb_per_s": moved / best_s / 1e9,
        }
    except MemoryError:
        return {
            "method": "numpy copy",
            "size_mib": size_mib,
            "error": "not enough memory for the copy",
            "gb_per_s": None,
        }
