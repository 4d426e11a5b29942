"""A soak whose Locust workers run on "another host": a second network namespace joined to the harness's by a veth
pair (the harness, its Locust master and the real llama-server in one, ``specsoak worker`` in the other; traffic only
between the two). The open-loop schedule is kept over both workers, and a worker killed mid-soak is a ``worker_lost``
verdict with its unsent arrivals left out of the offered rate, never a silent drop in load (docs/fleet.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import yaml

from harness.load.schedule import soak_offsets, worker_share
from harness.records.files import RequestRecord, read_jsonl
from tests.faults.helpers import finish, wait_for
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

NET = "10.213.{}.{}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    """(harness namespace, workers namespace, the harness side's address); both deleted afterwards."""
    tag = os.getpid() % 200 + 20
    ns_h, ns_w = f"ss-h{os.getpid()}", f"ss-w{os.getpid()}"
    veth_h, veth_w = f"ssh{tag}", f"ssw{tag}"
    host_ip, worker_ip = NET.format(tag, 1), NET.format(tag, 2)
    _ip("netns", "add", ns_h)
    try:
        _ip("netns", "add", ns_w)
        _ip("link", "add", veth_h, "type", "veth", "peer", "name", veth_w)
        _ip("link", "set", veth_h, "netns", ns_h)
        _ip("link", "set", veth_w, "netns", ns_w)
        for ns, dev, addr in ((ns_h, veth_h, host_ip), (ns_w, veth_w, worker_ip)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ns_h, ns_w, host_ip
    finally:
        for ns in (ns_w, ns_h):  # deleting a namespace deletes the veth end in it, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def _in(ns: str, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "harness.cli", *args],
        stdout=subprocess.PIPE if log is None else log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        start_new_session=True,
    )


def _locust_child(pid: int) -> psutil.Process | None:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    return next((k for k in kids if "locust" in " ".join(k.cmdline())), None)


def _scenario(tmp_path: Path, host_ip: str, arrival: dict[str, Any], duration_s: float) -> Path:
    data = {
        "name": "remote",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "host": host_ip, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 2,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": {
            "duration_s": duration_s,
            "arrival": arrival,
            "remote_workers": {"count": 2, "bind": host_ip, "port": 5557, "wait_s": 60},
            "max_tokens": 8,
            "after_repetitions": 1,
            "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 5},
        },
    }
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_workers_in_another_namespace_keep_the_schedule_and_a_killed_one_is_a_worker_lost_verdict(
    tmp_path: Path, two_hosts: tuple[str, str, str]
) -> None:
    ns_h, ns_w, host_ip = two_hosts
    arrival = {"kind": "poisson", "rate_rps": 1.0, "max_in_flight": 4, "seed": 11}
    duration = 40.0
    results = tmp_path / "results"
    harness = _in(ns_h, "run", str(_scenario(tmp_path, host_ip, arrival, duration)), "--results", str(results))
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [_in(ns_w, "worker", "--master", f"{host_ip}:5557", log=log) for log in logs]
    try:
        soak_dir = wait_for(lambda: next(results.glob("*-remote/soak"), None), 240, "the soak folder", harness)
        # both workers send, then one "host" dies: its Locust worker and its specsoak worker, unannounced
        try:
            wait_for(lambda: len(list(soak_dir.glob("*.jsonl"))) >= 2, 120, "records from both workers", harness)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(log.read_text()[-2000:] for log in logs)) from None
        time.sleep(12)
        victim = workers[1]
        child = _locust_child(victim.pid)
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
    print(
        f"remote workers: {len(records)} records of {len(schedule)} scheduled, {lost['unsent']} unsent by the lost one; "
        f"send delay p50 {np.median(delays) * 1e3:.2f} ms, p99 {np.quantile(delays, 0.99) * 1e3:.2f} ms, "
        f"late {sum(1 for r in records if r['late'])}; workers: {worker_out[0][-200:]!r}"
    )
