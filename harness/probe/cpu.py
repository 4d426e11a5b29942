"""CPU accounting during a measurement: engine, harness, every other process, and the machine itself.

On a small box a stolen core slows llama.cpp 5-20x, so every figure carries how much CPU
*other* processes used while it was measured. Other = all busy CPU time on the machine
(/proc/stat) minus the engine's process tree, the harness's own processes, the hypervisor's
steal and the kernel's interrupt time (irq + softirq), each of the last two counted apart: a VM's
idle background is mostly those (issue #33), and loopback traffic's softirq is the load's own. The
/proc root is injectable so tests can feed it files.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.probe.process import tree_sum

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class MachineTicks:
    """CPU seconds of all cores since boot, from /proc/stat's first line."""

    busy_s: float  # user + nice + system + irq + softirq + steal
    steal_s: float  # taken by the hypervisor for other guests
    irq_s: float  # hard and soft interrupts

    def __sub__(self, other: MachineTicks) -> MachineTicks:
        return MachineTicks(self.busy_s - other.busy_s, self.steal_s - other.steal_s, self.irq_s - other.irq_s)


def machine_ticks(proc_root: Path = Path("/proc")) -> MachineTicks:
    with open(proc_root / "stat", encoding="ascii") as f:
        fields = f.readline().split()
    if fields[0] != "cpu":
        raise ValueError(f"unexpected first line in {proc_root}/stat")
    v = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return MachineTicks((user + nice + system + irq + softirq + steal) / _TICK, steal / _TICK, (irq + softirq) / _TICK)


def machine_busy_seconds(proc_root: Path = Path("/proc")) -> float:
    """Busy CPU seconds of all cores since boot (user+nice+system+irq+softirq+steal)."""
    return machine_ticks(proc_root).busy_s


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU seconds used by a process and its live children; 0 if it is gone."""
    return tree_sum(pid, lambda q: (t := q.cpu_times()).user + t.system)


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass(frozen=True)
class CpuUse:
    wall_s: float
    engine_cpu_s: float
    harness_cpu_s: float
    other_cpu_s: float  # other processes'
    steal_cpu_s: float = 0.0  # the hypervisor's, for other guests
    irq_cpu_s: float = 0.0  # the kernel's interrupts (loopback traffic's softirq included)

    def _cores(self, cpu_s: float) -> float:
        return cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def other_cores(self) -> float:
        return self._cores(self.other_cpu_s)

    @property
    def steal_cores(self) -> float:
        return self._cores(self.steal_cpu_s)

    @property
    def irq_cores(self) -> float:
        return self._cores(self.irq_cpu_s)

    def contaminated(self, bound_cores: float) -> bool:
        """Whether the engine lost more than ``bound_cores`` to other processes and the hypervisor (interrupts are
        mostly the load's own loopback traffic, so they do not count)."""
        return self.other_cores + self.steal_cores > bound_cores

    @property
    def harness_cores(self) -> float:
        return self._cores(self.harness_cpu_s)

    @property
    def engine_cores(self) -> float:
        return self._cores(self.engine_cpu_s)

    def to_dict(self) -> dict[str, float]:
        """The CPU split as phases, ramp steps and soak windows record it (docs/metrics.md#cpu)."""
        return {
            "engine_cpu_s": self.engine_cpu_s,
            "harness_cpu_s": self.harness_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "engine_cores": self.engine_cores,
            "harness_cores": self.harness_cores,
            "other_cores": self.other_cores,
            "steal_cores": self.steal_cores,
            "irq_cores": self.irq_cores,
        }


class CpuMeter:
    """Start/stop around one measurement; :meth:`stop` returns the split of CPU time."""

    def __init__(self, engine_pid: int | None, proc_root: Path = Path("/proc"), client_pids: tuple[int, ...] = ()):
        self.engine_pid = engine_pid
        self.proc_root = proc_root
        self.client_pids = client_pids  # the harness's own load processes (a soak's Locust), counted as harness
        self._clients: dict[int, float] = {}
        self._t0 = 0.0
        self._machine0 = MachineTicks(0.0, 0.0, 0.0)
        self._eng0 = self._self0 = 0.0

    def start(self) -> CpuMeter:
        self._t0 = time.perf_counter()
        self._machine0 = machine_ticks(self.proc_root)
        self._eng0 = tree_cpu_seconds(self.engine_pid)
        self._self0 = self._harness_s()
        return self

    def _harness_s(self) -> float:
        total = self_cpu_seconds()
        for p in self.client_pids:  # a client process that has exited keeps the CPU it was last seen with
            self._clients[p] = max(self._clients.get(p, 0.0), tree_cpu_seconds(p))
            total += self._clients[p]
        return total

    def stop(self) -> CpuUse:
        wall = time.perf_counter() - self._t0
        machine = machine_ticks(self.proc_root) - self._machine0
        eng = max(0.0, tree_cpu_seconds(self.engine_pid) - self._eng0)  # 0 when the engine was restarted meanwhile
        mine = self._harness_s() - self._self0
        # jiffy rounding can make the remainder slightly negative
        other = max(0.0, machine.busy_s - machine.steal_s - machine.irq_s - eng - mine)
        return CpuUse(wall, eng, mine, other, max(0.0, machine.steal_s), max(0.0, machine.irq_s))
