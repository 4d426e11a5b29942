"""A soak whose Locust workers run on "another host": a second network namespace joined to the harness's by a veth
pair (the harness, its Locust master and the real llama-server in one, ``specsoak worker`` in the other; traffic only
between the two). The open-loop schedule is kept over both workers, and a worker killed mid-soak is a ``worker_lost``
verdict with its unsent arrivals left out of the offered rate, never a silent drop in load (docs/fleet.md)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.remote_workers import in_namespace, scenario, two_namespaces
from harness.load.schedule import soak_offsets, worker_share
from harness.records.files import RequestRecord, read_jsonl
from tests.faults.helpers import child_running, finish, wait_for

pytestmark = pytest.mark.engine


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    """(harness namespace, workers namespace, the harness side's address); both deleted afterwards."""
    with two_namespaces(os.getpid() % 200 + 20) as hosts:
        yield hosts


def test_workers_in_another_namespace_keep_the_schedule_and_a_killed_one_is_a_worker_lost_verdict(
    tmp_path: Path, two_hosts: tuple[str, str, str]
) -> None:
    ns_h, ns_w, host_ip = two_hosts
    arrival = {"kind": "poisson", "rate_rps": 1.0, "max_in_flight": 4, "seed": 11}
    duration = 40.0
    remote = {"count": 2, "bind": host_ip, "port": 5557, "wait_s": 60}
    results = tmp_path / "results"
    harness = in_namespace(
        ns_h,
        "run",
        str(scenario(tmp_path / "remote.yaml", arrival, duration, remote, host_ip)),
        "--results",
        str(results),
    )
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [in_namespace(ns_w, "worker", "--master", f"{host_ip}:5557", log=log) for log in logs]
    try:
        soak_dir = wait_for(lambda: next(results.glob("*-remote/soak"), None), 240, "the soak folder", harness)
        # both workers send, then one "host" dies: its Locust worker and its specsoak worker, unannounced
        try:
            wait_for(lambda: len(list(soak_dir.glob("*.jsonl"))) >= 2, 120, "records from both workers", harness)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(log.read_text()[-2000:] for log in logs)) from None
        time.sleep(12)
        victim = workers[1]
        child = child_running(victim.pid, "locust")
        assert child is not None
        child.send_signal(signal.SIGKILL)
        victim.send_signal(signal.SIGKILL)
        out = finish(harness, 400)
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
        worker_out = [log.read_text() for log in logs]
    assert harness.returncode == 0, out[-4000:]
    run_dir = soak_dir.parent

    # the verdict: exactly one, the lost worker, with what it left unsent
    verdicts = list(read_jsonl(run_dir / "verdicts.jsonl"))
    assert [v["kind"] for v in verdicts] == ["worker_lost"], verdicts
    lost = verdicts[0]["evidence"]
    assert lost["unsent"] > 0 and lost["sent"] > 0, lost
    assert "worker_lost" in out and "joined: clock" in out, out[-3000:]

    # every record is the harness's schema, shipped by a worker in the other namespace, on the master's clock
    records = [r for f in sorted(soak_dir.glob("*.jsonl")) for r in read_jsonl(f)]
    assert records and all(set(r) == set(RequestRecord.__dataclass_fields__) for r in records)
    whos = {r["id"].split("/")[1] for r in records}
    assert len(whos) == 2, whos
    # the schedule over both workers: each request went out at its slot of the soak's one schedule
    pacing = [yaml.safe_load(p.read_text()) for p in soak_dir.glob("*.pacing.json")]
    assert len(pacing) == 2 and len({round(p["t0_unix"], 6) for p in pacing}) == 1, pacing
    t0 = pacing[0]["t0_unix"]
    schedule = soak_offsets(arrival, 0.0, duration, duration)
    due = np.array(sorted(r["scheduled_unix_s"] - t0 for r in records))
    nearest = np.abs(schedule[np.searchsorted(schedule, due).clip(0, len(schedule) - 1)] - due)
    nearest = np.minimum(nearest, np.abs(schedule[(np.searchsorted(schedule, due) - 1).clip(0)] - due))
    assert nearest.max() < 1e-3, nearest.max()  # on the schedule to the ms, both clocks brought to the master's
    delays = np.array([r["send_delay_s"] for r in records])
    starts = np.array([r["start_unix_s"] - r["scheduled_unix_s"] for r in records])
    assert np.allclose(starts, delays, atol=2e-3)
    # the survivor sent its whole share; the lost one its share up to the loss, and the rest is counted unsent
    survivor_index = 1 - int(lost["index"])
    mine = worker_share(len(schedule), survivor_index, 2)
    assert len(records) + lost["unsent"] >= len(schedule) - 2  # at most the lost worker's in-flight records missing
    assert len(records) >= len(mine)
    # offered and achieved per window, as the soak table gives them: offered counts only what someone will send
    windows = [w for w in read_jsonl(run_dir / "windows.jsonl") if w.get("scheduled") is not None]
    after = [w for w in windows if w["soak_t_start_s"] >= lost["soak_t_s"]]
    assert after, windows
    for w in after:
        span = (schedule[mine] >= w["soak_t_start_s"]) & (schedule[mine] < w["soak_t_end_s"])
        assert w["scheduled"] == int(span.sum()), (w, lost)
    end = next(e for e in read_jsonl(run_dir / "soak_slices.jsonl") if e["event"] == "end")
    book = {w["index"]: w for w in end["workers"]}
    assert {0, 1} <= set(book) and book[int(lost["index"])]["lost_unix"] is not None, end["workers"]
    assert all(abs(w["clock_offset_s"]) < 0.05 and w["rtt_s"] < 0.05 for w in book.values()), book
    assert book[survivor_index]["sent"] == book[survivor_index]["scheduled"] == len(mine), book  # its whole share
    print(
        f"remote workers: {len(records)} records of {len(schedule)} scheduled, {lost['unsent']} unsent by the lost one; "
        f"send delay p50 {np.median(delays) * 1e3:.2f} ms, p99 {np.quantile(delays, 0.99) * 1e3:.2f} ms, "
        f"late {sum(1 for r in records if r['late'])}; workers: {worker_out[0][-200:]!r}"
    )
