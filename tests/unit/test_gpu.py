"""GPU memory through NVML (harness/probe/gpu.py): a fake NVML module at the boundary, the real pynvml without a
driver, and the report's memory table with and without GPU samples."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from harness.probe.gpu import DeviceMemory, GpuMeter, GpuSample, process_tree
from harness.report.build import build_report

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"
GIB = 2**30


class NVMLError(Exception):
    pass


class FakeNvml:
    """The pynvml calls harness/probe/gpu.py makes, over two devices; ``fail`` names calls that raise NVMLError."""

    NVMLError = NVMLError

    def __init__(
        self,
        compute: dict[int, list[tuple[int, int | None]]] | None = None,
        graphics: dict[int, list[tuple[int, int | None]]] | None = None,
        count: int = 2,
    ) -> None:
        self.count = count
        self.used = {0: 10 * GIB, 1: 3 * GIB}
        self.compute = compute or {}
        self.graphics = graphics or {}
        self.fail: set[str] = set()
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise NVMLError(f"{name}: GPU is lost")

    def nvmlInit(self) -> None:
        self._call("init")

    def nvmlShutdown(self) -> None:
        self._call("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("count")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes | str:
        return b"NVIDIA H200" if h == 0 else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._call(f"memory{h}")
        return SimpleNamespace(used=self.used[h], total=(141 if h == 0 else 80) * GIB, free=0)

    def _procs(self, table: dict[int, list[tuple[int, int | None]]], h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in table.get(h, [])]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        self._call("compute")
        return self._procs(self.compute, h)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        self._call("graphics")
        return self._procs(self.graphics, h)


# ---- the NVML boundary --------------------------------------------------------------------------------
def test_two_devices_and_the_engine_tree_summed_over_them() -> None:
    nv = FakeNvml(
        compute={0: [(100, 8 * GIB), (999, 1 * GIB)], 1: [(101, 2 * GIB)]}, graphics={0: [(100, 8 * GIB)]}
    )  # the same process in both lists holds one allocation
    meter = GpuMeter(nvml=nv)
    assert meter.available and meter.why is None
    s = meter.sample({100, 101, 102})
    assert s.available and s.why is None
    assert s.devices == (
        DeviceMemory(0, "NVIDIA H200", 10 * GIB, 141 * GIB),
        DeviceMemory(1, "NVIDIA H100 80GB HBM3", 3 * GIB, 80 * GIB),
    )
    assert s.used_bytes == 13 * GIB and s.total_bytes == 221 * GIB
    assert s.process_bytes == 10 * GIB and s.process_why is None  # pid 999 is not the engine's
    d = s.to_dict()
    assert (
        d["used_bytes"] == 13 * GIB
        and d["process_bytes"] == 10 * GIB
        and d["devices"][1]["name"] == "NVIDIA H100 80GB HBM3"
    )
    assert json.loads(json.dumps(d)) == d
    meter.sample({100})
    assert nv.calls.count("init") == 1 and nv.calls.count("count") == 1  # initialised once, handles kept
    meter.close()
    meter.close()
    assert nv.calls.count("shutdown") == 1


def test_no_pids_means_no_process_query_and_engine_unknown() -> None:
    nv = FakeNvml(compute={0: [(100, GIB)]})
    s = GpuMeter(nvml=nv).sample()
    assert s.available and s.used_bytes == 13 * GIB
    assert s.process_bytes is None and s.process_why == "no engine process given"
    assert "compute" not in nv.calls and "graphics" not in nv.calls


@pytest.mark.parametrize(
    ("compute", "why"),
    [
        ({0: [(100, None)]}, "does not report"),  # WDDM / MIG / old drivers: usedGpuMemory N/A
        ({0: [(100, 4 * GIB)], 1: [(101, None)]}, "does not report"),  # one unknown makes the sum unknown
        ({0: [(555, 4 * GIB)]}, "lists none"),  # only other processes (or the engine in another PID namespace)
        ({}, "lists none"),
    ],
)
def test_engine_memory_unknown_is_none_never_0(compute: dict[int, list[tuple[int, int | None]]], why: str) -> None:
    s = GpuMeter(nvml=FakeNvml(compute=compute)).sample({100, 101})
    assert s.available and s.used_bytes == 13 * GIB
    assert s.process_bytes is None and why in (s.process_why or "")
    assert s.to_dict()["process_bytes"] is None


def test_nvml_error_on_init_is_unavailable_with_a_why() -> None:
    nv = FakeNvml()
    nv.fail.add("init")
    meter = GpuMeter(nvml=nv)
    assert not meter.available and "NVML could not start" in (meter.why or "")
    s = meter.sample({1})
    assert not s.available and s.devices == () and s.used_bytes is None and s.process_bytes is None
    assert s.to_dict() == {
        "available": False,
        "why": meter.why,
        "used_bytes": None,
        "total_bytes": None,
        "process_bytes": None,
        "process_why": None,
        "devices": [],
    }
    meter.close()
    assert "shutdown" not in nv.calls  # nothing was started


def test_no_device_is_unavailable_and_shuts_nvml_down() -> None:
    nv = FakeNvml(count=0)
    s = GpuMeter(nvml=nv).sample()
    assert not s.available and s.why == "NVML sees no GPU" and nv.calls[-1] == "shutdown"


def test_nvml_error_mid_run_is_a_sample_not_an_exception() -> None:
    nv = FakeNvml(compute={0: [(100, GIB)]})
    meter = GpuMeter(nvml=nv)
    assert meter.sample({100}).available
    nv.fail.add("memory1")  # GPU 1 falls off the bus
    s = meter.sample({100})
    assert not s.available and "GPU 1" in (s.why or "") and "lost" in (s.why or "")
    assert s.to_dict()["used_bytes"] is None
    nv.fail = {"compute"}  # memory readable, the process list not: devices known, the engine not
    s = meter.sample({100})
    assert (
        s.available and s.used_bytes == 13 * GIB and s.process_bytes is None and "cannot list" in (s.process_why or "")
    )


def test_pynvml_missing_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    meter = GpuMeter()
    s = meter.sample({1})
    assert not s.available and "pynvml is not installed" in (s.why or "")
    meter.close()


def test_real_pynvml_says_why_without_a_driver_and_measures_with_one() -> None:
    smi = shutil.which("nvidia-smi")
    driver = (
        bool(smi) and subprocess.run([str(smi), "-L"], capture_output=True, timeout=60, check=False).returncode == 0
    )
    with GpuMeter() as meter:  # the installed nvidia-ml-py
        s = meter.sample({os.getpid()})
        d = s.to_dict()
        if driver:  # a GPU machine (scripts/gpu-check.sh shows more)
            assert s.available and d["used_bytes"] > 0 and d["total_bytes"] > 0, s.why
        else:
            assert not s.available and s.why and "NVML" in s.why
            assert d["used_bytes"] is None and d["total_bytes"] is None and d["process_bytes"] is None


def test_process_tree_of_this_process() -> None:
    assert os.getpid() in process_tree(os.getpid())
    assert process_tree(None) == set() and process_tree(2**22 + 12345) == set()


# ---- the report's memory table --------------------------------------------------------------------------
def _gpu(used_gib: float, engine_gib: float | None) -> dict[str, Any]:
    s = GpuSample(
        True,
        None,
        (DeviceMemory(0, "NVIDIA H200", int(used_gib * GIB), 141 * GIB),),
        int(engine_gib * GIB) if engine_gib is not None else None,
        None if engine_gib is not None else "N/A",
    )
    return s.to_dict()


def _with_gpu(run_dir: Path, gpu_of: Any) -> None:
    path = run_dir / "phases.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in recs:
        g = gpu_of(r)
        if g is not None:
            r["gpu"] = g
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_memory_table_without_gpu_samples_is_na(tmp_path: Path) -> None:
    run_dir = tmp_path / "20261129T102500Z-quick"
    shutil.copytree(FIXTURE, run_dir)
    rep = build_report([run_dir])
    m = rep.tables["memory"]
    assert m["gpu_used_mib"].isna().all() and m["engine_gpu_mib"].isna().all() and (m["gpu_phases"] == 0).all()
    assert (m["gpu_note"] == "no GPU sample recorded").all()
    shown = _memory_rows(rep.markdown.read_text())
    assert {(r["GPU used MiB"], r["engine GPU MiB"]) for r in shown.values()} == {("n/a", "n/a")}


def test_memory_table_peaks_gpu_over_phases(tmp_path: Path) -> None:
    run_dir = tmp_path / "20261129T102500Z-quick"
    shutil.copytree(FIXTURE, run_dir)

    def gpu_of(r: dict[str, Any]) -> dict[str, Any] | None:
        if r["config"] == "baseline":  # the peak over phases, per configuration
            return _gpu(20 + r["streams"] + r["repetition"] / 10, 18 + r["streams"])
        if r["config"] == "draft-self-k3":  # the driver gives no per-process figure
            return _gpu(30, None)
        if r["streams"] == 1:  # ngram-map-k: NVML lost at 1 stream, nothing recorded at 4; n/a, never 0
            return GpuSample(False, "NVML error on GPU 0 (NVIDIA H200): GPU is lost").to_dict()
        return None

    _with_gpu(run_dir, gpu_of)
    rep = build_report([run_dir])
    m = rep.tables["memory"].set_index("config")
    assert m.loc["baseline", "gpu_used_mib"] == pytest.approx(24.3 * 1024)  # 4 streams, repetition 3
    assert m.loc["baseline", "engine_gpu_mib"] == pytest.approx(22 * 1024)
    assert m.loc["baseline", "gpu_total_mib"] == pytest.approx(141 * 1024) and m.loc["baseline", "gpu_phases"] == 6
    assert pd.isna(m.loc["baseline", "gpu_note"])
    assert m.loc["draft-self-k3", "gpu_used_mib"] == pytest.approx(30 * 1024)
    assert pd.isna(m.loc["draft-self-k3", "engine_gpu_mib"]) and m.loc["draft-self-k3", "gpu_note"] == "engine: N/A"
    assert pd.isna(m.loc["ngram-map-k", "gpu_used_mib"]) and pd.isna(m.loc["ngram-map-k", "engine_gpu_mib"])
    assert "GPU is lost" in m.loc["ngram-map-k", "gpu_note"] and m.loc["ngram-map-k", "gpu_phases"] == 0
    shown = {c: (r["GPU used MiB"], r["engine GPU MiB"]) for c, r in _memory_rows(rep.markdown.read_text()).items()}
    assert shown == {
        "baseline": ("24,883", "22,528"),
        "draft-self-k3": ("30,720", "n/a"),
        "ngram-map-k": ("n/a", "n/a"),
    }


def _memory_rows(md: str) -> dict[str, dict[str, str]]:
    """The report's memory table (the one with GPU columns), by configuration."""
    lines = [line for line in md.splitlines() if line.startswith("|")]
    start = next(i for i, line in enumerate(lines) if "GPU used MiB" in line)
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(head):
            break
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows
