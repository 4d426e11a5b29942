"""A soak window's assembly (harness/soak/assemble.py) without an engine: the keys, in the order windows.jsonl has them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engines.types import EngineCounters
from harness.load.pacing import window_traffic
from harness.probe.cpu import CpuUse
from harness.records.types import SoakWindow
from harness.soak.assemble import judged_window, live_window, settle_window, window_delta
from harness.soak.figures import memory_figures

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "soak_records"
GPU = {
    "available": False,
    "why": "no NVML",
    "used_bytes": None,
    "total_bytes": None,
    "process_bytes": None,
    "process_why": None,
    "devices": [],
}


def _record(start: float, status: str = "ok") -> dict[str, Any]:
    return {
        "status": status,
        "start_unix_s": start,
        "ttft_s": 0.2,
        "e2e_s": 1.0,
        "itl_s": [0.1] * 8,
        "chunk_tokens": [1] * 9,
        "output_tokens": 9,
        "decode_tps": 10.0,
    }


def _assemble(cpu: CpuUse | None, open_loop: bool = False, previous: dict[str, Any] | None = None) -> SoakWindow:
    t0, t1 = 1000.0, 1008.0
    before = EngineCounters(output_tokens=100.0, draft_tokens=50.0, accepted_tokens=30.0, requests_finished=10.0)
    after = EngineCounters(output_tokens=136.0, draft_tokens=90.0, accepted_tokens=60.0, requests_finished=14.0)
    win = live_window(
        config="spec",
        slice_id="spec-s001",
        t0=t0,
        t1=t1,
        delta=window_delta(before, after),
        memory=memory_figures(None, None),
        probe_latencies_s=[0.01, 0.2],
        users=None if open_loop else 2,
        engine_pid=7,
        engine_uptime_s=60.0,
        engine_restart=False,
        harness_rss_mib=300.0,
        machine_memory_available_mib=9000.0,
        gpu=GPU,
        cpu=cpu,
        cpu_engine_restarted=False,
        contamination_cores=0.5,
    )
    ended = [_record(1000.5 + i) for i in range(4)]
    win = settle_window(
        win,
        ended,
        [_record(1007.5)],
        previous,
        after,
        window_traffic(ended, t1 - t0, (None, None, None)),
        open_loop,
        outstanding_end=3 if open_loop else None,
    )
    return judged_window(win, True, None, {"output_tps": {}}, (None, None), (None, None))


def test_an_assembled_window_has_a_real_windows_keys_in_their_order() -> None:
    real = json.loads((RECORDS / "cache" / "windows.jsonl").read_text().splitlines()[3])
    w = _assemble(CpuUse(8.0, 12.0, 2.0, 0.4))
    keys = list(real)
    keys.insert(keys.index("max_chunk_gap_s"), "paused_s")  # the capture is older than the engine's pauses per window
    assert list(w.to_dict()) == keys and w.paused_s == 0.0
    assert w.probe_max_s == 0.2 and w.users == 2 and w.t_unix == 1004.0 and w.requests == 4 and w.errors == 0
    assert w.extra["counters"]["output_tokens"] == 36.0 and w.acceptance == 0.75
    assert w.extra["engine_cores"] == 1.5 and w.contaminated is False  # 0.05 other cores under the 0.5 allowed
    assert w.extra["engine_requests_done"] == 14.0  # the engine's own count where it has one


def test_without_a_cpu_meter_no_cpu_keys_and_not_contaminated() -> None:
    d = _assemble(None).to_dict()
    assert "cpu" not in d and "engine_cores" not in d and d["contaminated"] is False


def test_open_loop_windows_add_the_backlog_after_the_traffic() -> None:
    keys = list(_assemble(None, open_loop=True).to_dict())
    assert keys[keys.index("goodput_rps") + 1 : keys.index("judged")] == [
        "outstanding_end",
        "draining",
        "load_settled",
        "backlog_inherited",
    ]


def test_counters_that_fell_inside_a_window_are_the_engines_totals() -> None:
    before = EngineCounters(output_tokens=500.0)
    after = EngineCounters(output_tokens=40.0)  # restarted inside the window
    assert window_delta(before, after) == after
    assert window_delta(None, after) is None
    assert window_delta(EngineCounters(output_tokens=10.0), after).output_tokens == 30.0  # type: ignore[union-attr]  # both scrapes given: not None
