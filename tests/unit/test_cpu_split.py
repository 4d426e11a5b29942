"""The CPU split (harness/probe/cpu.py): the hypervisor's steal and the kernel's interrupts counted apart from other
processes (issue #33: a VM's idle background, 0.035-0.13 cores here, is mostly those), and contamination is what the
engine lost to other processes and the hypervisor."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.probe.cpu import CpuMeter, CpuUse, machine_ticks

# /proc/stat's first line on this machine (2026-12-05, Linux 6.1, USER_HZ 100): user nice system idle iowait irq softirq
# steal guest guest_nice
CAPTURE = "cpu  510242 0 15146 239960 513 0 414 534 0 0\n"


def _stat(folder: Path, line: str) -> None:
    (folder / "stat").write_text(line + "cpu0 1 2 3 4 5 6 7 8 0 0\nintr 0\n")


def test_steal_and_interrupts_are_read_apart_from_the_busy_time(tmp_path: Path) -> None:
    _stat(tmp_path, CAPTURE)
    t = machine_ticks(tmp_path)
    assert t.busy_s == pytest.approx((510242 + 15146 + 414 + 534) / 100)
    assert t.steal_s == pytest.approx(5.34) and t.irq_s == pytest.approx(4.14)


def test_a_measurement_counts_steal_and_interrupts_apart_from_other_processes(tmp_path: Path) -> None:
    _stat(tmp_path, CAPTURE)
    meter = CpuMeter(None, proc_root=tmp_path).start()
    # meanwhile: 1.0 s of user time by other processes, 0.3 s stolen, 0.2 s of softirq
    _stat(tmp_path, "cpu  510342 0 15146 239960 513 0 434 564 0 0\n")
    use = meter.stop()
    assert use.steal_cpu_s == pytest.approx(0.3) and use.irq_cpu_s == pytest.approx(0.2)
    assert use.other_cpu_s == pytest.approx(1.0, abs=0.05)  # less the harness's own few milliseconds
    assert set(use.to_dict()) >= {"other_cores", "steal_cores", "irq_cores"}


def test_contamination_is_other_processes_and_steal_not_interrupts() -> None:
    # 10-s window, bound 0.05 cores
    assert CpuUse(10.0, 5.0, 0.5, other_cpu_s=0.3, steal_cpu_s=0.3).contaminated(0.05)
    assert not CpuUse(10.0, 5.0, 0.5, other_cpu_s=0.3, steal_cpu_s=0.1, irq_cpu_s=2.0).contaminated(0.05)
    assert CpuUse(10.0, 5.0, 0.5, other_cpu_s=0.0, steal_cpu_s=0.6).contaminated(0.05)
