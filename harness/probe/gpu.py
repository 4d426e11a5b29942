"""GPU memory through NVML: per device used/total, and the engine's process tree where the driver says.

One ``GpuMeter`` per run: NVML is initialised on the first use and kept until ``close()``. A
machine without ``pynvml``, without a driver or without a GPU gives samples with
``available=False`` and the reason in ``why``; an NVML error later (a GPU lost mid-run) gives such a
sample too, never an exception. Unknown figures are ``None`` (``n/a`` in the report), never 0.
The NVML module is injectable so tests feed a fake (docs/metrics.md, *GPU memory*).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

MIB = 2**20


@dataclass(frozen=True)
class DeviceMemory:
    index: int
    name: str
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """One look at GPU memory. ``process_bytes``: the engine's processes on every device, summed; ``None``
    when not known (``process_why`` says why): no pids given, NVML cannot list processes, none of the
    pids is listed (another PID namespace, or not on the GPU), or the driver gives no per-process figure."""

    available: bool
    why: str | None = None
    devices: tuple[DeviceMemory, ...] = ()
    process_bytes: int | None = None
    process_why: str | None = None

    @property
    def used_bytes(self) -> int | None:
        return sum(d.used_bytes for d in self.devices) if self.available else None

    @property
    def total_bytes(self) -> int | None:
        return sum(d.total_bytes for d in self.devices) if self.available else None

    def to_dict(self) -> dict[str, Any]:
        """The record form (``"gpu"`` in phases.jsonl and windows.jsonl): ``None`` where unknown, never 0."""
        return {
            "available": self.available,
            "why": self.why,
            "used_bytes": self.used_bytes,
            "total_bytes": self.total_bytes,
            "process_bytes": self.process_bytes if self.available else None,
            "process_why": self.process_why,
            "devices": [
                {"index": d.index, "name": d.name, "used_bytes": d.used_bytes, "total_bytes": d.total_bytes}
                for d in self.devices
            ],
        }


def unavailable(why: str) -> GpuSample:
    return GpuSample(available=False, why=why)


def process_tree(pid: int | None) -> set[int]:
    """A process and its live children (the pids to pass to ``GpuMeter.sample``); empty if it is gone."""
    if pid is None:
        return set()
    import psutil  # here, not at import: harness.probe.gpu alone needs only pynvml (scripts/gpu-check.sh)

    try:
        p = psutil.Process(pid)
        return {pid, *(c.pid for c in p.children(recursive=True))}
    except psutil.Error:
        return set()


class GpuMeter:
    """Samples GPU memory through NVML. Thread-safe; each sample costs one memory query per device, and two
    process-list queries per device when pids are given."""

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml: Any = nvml
        self._lock = threading.Lock()
        self._started = False
        self._why: str | None = None
        self._handles: list[tuple[int, str, Any]] = []

    # ---- set-up ----------------------------------------------------------------------------------
    def _error_types(self) -> tuple[type[BaseException], ...]:
        err = getattr(self._nvml, "NVMLError", None)
        return (err, OSError) if isinstance(err, type) and issubclass(err, BaseException) else (OSError,)

    def _start(self) -> None:
        """Once: import, nvmlInit, the device handles and names. Sets ``_why`` when NVML cannot be used."""
        if self._started:
            return
        self._started = True
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py: imports without a driver; nvmlInit is what fails
            except ImportError as exc:
                self._why = f"pynvml is not installed ({exc})"
                return
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except self._error_types() as exc:
            self._why = f"NVML could not start: {exc} (no NVIDIA driver?)"
            return
        try:
            count = int(nv.nvmlDeviceGetCount())
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self._handles.append((i, _text(nv.nvmlDeviceGetName(h)), h))
        except self._error_types() as exc:
            self._why = f"NVML could not list the GPUs: {exc}"
        else:
            if not self._handles:
                self._why = "NVML sees no GPU"
        if self._why:
            self._handles = []
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._error_types():
            pass

    @property
    def available(self) -> bool:
        """Whether NVML started and sees a GPU (initialises NVML on first use)."""
        with self._lock:
            self._start()
            return self._why is None

    @property
    def why(self) -> str | None:
        """Why NVML cannot be used, ``None`` when it can."""
        with self._lock:
            self._start()
            return self._why

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self, pids: Iterable[int] | None = None) -> GpuSample:
        """Used and total memory of every GPU NVML sees; with ``pids`` (the engine's process tree), what those
        processes hold on them. Never raises for NVML's sake: a failure is a sample with ``available=False``."""
        with self._lock:
            self._start()
            if self._why is not None:
                return unavailable(self._why)
            nv, errors = self._nvml, self._error_types()
            devices: list[DeviceMemory] = []
            for index, name, h in self._handles:
                try:
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                    devices.append(DeviceMemory(index, name, int(mem.used), int(mem.total)))
                except errors as exc:
                    return unavailable(f"NVML error on GPU {index} ({name}): {exc}")
            process_bytes, process_why = (
                (None, "no engine process given") if pids is None else self._processes(set(pids))
            )
            return GpuSample(True, None, tuple(devices), process_bytes, process_why)

    def _processes(self, pids: set[int]) -> tuple[int | None, str | None]:
        """GPU memory of ``pids`` on every device: compute and graphics lists, one entry per (device, pid)."""
        nv, errors = self._nvml, self._error_types()
        found: dict[tuple[int, int], int | None] = {}
        for index, _name, h in self._handles:
            for query in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    procs = query(h)
                except errors as exc:
                    return None, f"NVML cannot list the processes on GPU {index}: {exc}"
                for p in procs:
                    pid = int(p.pid)
                    if pid not in pids:
                        continue
                    used = getattr(p, "usedGpuMemory", None)  # pynvml: None for NVML_VALUE_NOT_AVAILABLE
                    key = (index, pid)
                    # the same process in both lists holds one allocation on that device: count it once
                    found[key] = int(used) if used is not None else found.get(key)
        if not found:
            return None, "NVML lists none of the engine's processes (another PID namespace, or not on the GPU)"
        if any(v is None for v in found.values()):
            return None, "the driver does not report the engine's per-process GPU memory (N/A)"
        return sum(v for v in found.values() if v is not None), None

    def close(self) -> None:
        """nvmlShutdown, once; a later sample starts NVML again."""
        with self._lock:
            if self._started and self._why is None and self._nvml is not None:
                self._shutdown()
            self._started, self._why, self._handles = False, None, []

    def __enter__(self) -> GpuMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(v: bytes | str) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
