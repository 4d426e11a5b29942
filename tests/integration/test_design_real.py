"""Issue #15's proof on the real engine: the machine slows down halfway through a run.

Two configurations that are the same baseline (``a`` and ``b``: the true ratio b / a is 1.0) are
measured in both designs while the test slows every llama-server the run starts from halfway on
(SIGSTOP for half of every 0.2 s, as a busier machine would). Halfway is counted in engine starts:
the sequential run's second engine (``b``'s, all its repetitions) and the interleaved run's blocks
after the first half.

* Sequential: ``b`` is measured entirely on the slow machine; its ratio to ``a`` comes out well below
  1.0 with an interval that excludes 1.0: a wrong verdict that looks certain.
* Interleaved: in every block both sides of the pair share the machine's speed; the ratio stays
  within its interval of 1.0, and the control (``a``'s solo t/s block by block) flags the slowdown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness.report.build import build_report
from tests.faults.helpers import engine_child
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

REPS = 6  # with 4 pairs the interval excluded 1.0 on noise alone now and then (2 requests a phase)
HALF = REPS // 2


class SlowFromNthEngine(threading.Thread):
    """Duty-cycles (SIGSTOP/SIGCONT) every llama-server of the harness from its ``nth`` distinct process on."""

    def __init__(self, harness_pid: int, nth: int, stopped_s: float = 0.1, period_s: float = 0.2):
        super().__init__(daemon=True)
        self.harness_pid, self.nth = harness_pid, nth
        self.stopped_s, self.period_s = stopped_s, period_s
        self.seen: list[int] = []
        self.slowed: set[int] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            eng = engine_child(self.harness_pid)
            if eng is None:
                time.sleep(0.02)
                continue
            if eng.pid not in self.seen:
                self.seen.append(eng.pid)
            if len(self.seen) < self.nth:
                time.sleep(0.02)
                continue
            self.slowed.add(eng.pid)
            try:
                os.kill(eng.pid, signal.SIGSTOP)
                time.sleep(self.stopped_s)
            finally:
                _cont(eng)
            time.sleep(self.period_s - self.stopped_s)


def _cont(eng: psutil.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(eng.pid, signal.SIGCONT)


def _run(tmp_path: Path, design: str, slow_from: int) -> tuple[Path, SlowFromNthEngine]:
    data: dict[str, Any] = {
        "name": f"slowdown-{design}",
        "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "a", "algorithm": "none"}, {"name": "b", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 48,
            "streams": [1],
            "requests_per_stream": 2,
            "repetitions": REPS,
            "warmup_requests": 1,
            "design": design,
            "order_seed": 3,
            # the test's own SIGSTOP loop is not another process eating CPU
            "contamination_cores": float(os.environ.get("SPECSOAK_TEST_CONTAMINATION_CORES", "0.05")),
        },
    }
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", str(path), "--results", str(tmp_path / "results"), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    slow = SlowFromNthEngine(proc.pid, slow_from)
    slow.start()
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        slow.done.set()
        slow.join(5)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    return next((tmp_path / "results").glob(f"*-{data['name']}")), slow


def test_interleaving_keeps_the_ratio_where_the_sequential_design_is_fooled(tmp_path: Path) -> None:
    seq_dir, seq_slow = _run(tmp_path, "sequential", slow_from=2)  # b's engine: all of b's repetitions slowed
    inter_dir, inter_slow = _run(
        tmp_path, "interleaved", slow_from=REPS + 1
    )  # the second half of the blocks: both a and b slowed
    assert len(seq_slow.seen) == 2 and len(seq_slow.slowed) == 1
    assert len(inter_slow.seen) == 2 * REPS and len(inter_slow.slowed) == REPS

    seq = build_report([seq_dir])
    b_seq = seq.verdict.set_index("config").loc["b"]
    assert b_seq["baseline"] == "a" and b_seq["solo_speedup_reps"] == REPS
    # fooled: b looks clearly slower than a, with an interval that excludes the truth
    assert b_seq["solo_speedup"] < 0.8 and b_seq["solo_speedup_ci_high"] < 1.0, b_seq.to_dict()

    inter = build_report([inter_dir])
    b_int = inter.verdict.set_index("config").loc["b"]
    assert b_int["solo_speedup_reps"] == REPS
    # A 95% interval misses the truth in 1 run of 20 by construction (CI 2026-12-06: high 0.993), so it is
    # asked to reach within 5% of 1.0; the sequential design's interval ends below 1.0 by its bias, not by chance.
    lo, hi = b_int["solo_speedup_ci_low"], b_int["solo_speedup_ci_high"]
    assert lo <= 1.05 and hi >= 0.95, b_int.to_dict()
    assert 0.85 < b_int["solo_speedup"] < 1.18
    assert abs(b_int["solo_speedup"] - 1.0) < 0.5 * abs(b_seq["solo_speedup"] - 1.0), (b_int.to_dict(), b_seq.to_dict())
    # the control saw the machine slow down: a's solo t/s in the second half of the blocks against the first
    control = inter.tables["control"]
    a = control[control["baseline"] == "a"].set_index("repetition")["control_decode_tps"]
    assert a.loc[range(HALF + 1, REPS + 1)].max() < 0.8 * a.loc[range(1, HALF + 1)].min(), a.to_dict()
    cs = inter.tables["control_summary"].set_index("baseline")
    assert bool(cs.loc["a", "drifted"])
    md = inter.markdown.read_text()
    assert f"**interleaved**, {REPS} blocks, order seed 3" in md and "The machine's speed drifted" in md
    assert "**sequential**" in seq.markdown.read_text()
