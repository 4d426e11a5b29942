"""Remote Locust workers' arithmetic (harness/load/workers.py): clock offsets, record times, the master's book, the
arrivals a lost worker leaves unsent. The live proof, workers in another network namespace:
tests/integration/test_remote_workers.py."""

from __future__ import annotations

import numpy as np
import pytest

from harness.load.schedule import worker_share
from harness.load.workers import FILE_NAME, WorkerBook, clock_offset, lost_arrivals, safe_host, to_master_clock


def _ping(offset: float, t_master: float, up: float, down: float) -> tuple[float, float, float]:
    """A ping sent ``up`` s before the master read its clock at ``t_master``, answered ``down`` s later (worker clock
    = master clock + offset)."""
    return (t_master - up + offset, t_master, t_master + down + offset)


def test_clock_offset_takes_the_shortest_round_trip_and_errs_by_at_most_half_of_it() -> None:
    true = 0.7342
    samples = [_ping(true, 100.0, 0.050, 0.002), _ping(true, 101.0, 0.0004, 0.0006), _ping(true, 102.0, 0.003, 0.2)]
    offset, rtt = clock_offset(samples)
    assert rtt == pytest.approx(0.001)
    assert abs(offset - true) <= rtt / 2 + 1e-12
    # a symmetric path gives the offset exactly; a lopsided one (all of it on the way up) errs by exactly half of it
    assert clock_offset([_ping(-3.0, 5.0, 0.01, 0.01)])[0] == pytest.approx(-3.0)
    assert clock_offset([_ping(-3.0, 5.0, 0.02, 0.0)])[0] == pytest.approx(-3.0 - 0.01)
    with pytest.raises(ValueError, match="no clock sample"):
        clock_offset([])


def test_records_move_to_the_masters_clock_and_keep_every_other_field() -> None:
    rec = {"start_unix_s": 1000.5, "scheduled_unix_s": 1000.25, "e2e_s": 2.0, "ttft_s": 0.1, "id": "s/x-1/0"}
    out = to_master_clock(rec, 0.25)
    assert out == {**rec, "start_unix_s": 1000.25, "scheduled_unix_s": 1000.0}
    assert rec["start_unix_s"] == 1000.5  # the worker's own copy is not changed
    assert to_master_clock({"start_unix_s": 1.0, "scheduled_unix_s": None}, 1.0) == {
        "start_unix_s": 0.0,
        "scheduled_unix_s": None,
    }


def test_the_book_counts_each_workers_records_and_names_a_lost_one_once() -> None:
    book = WorkerBook()
    for cid, index in (("a", 0), ("b", 1)):
        book.joined(
            cid, {"index": index, "host": "gen 1", "pid": 10 + index, "clock_offset_s": 0.001, "rtt_s": 0.0002}, 5.0
        )
    book.shipped("a", [{"status": "ok"}, {"status": "error"}, {"status": "ok"}], 7.0)
    book.shipped("b", [{"status": "ok"}], 8.0)
    book.shipped("nobody", [{"status": "ok"}], 8.0)  # a worker that never said hello counts nowhere
    book.pacing("b", 40)
    assert book.missing(["a", "b"], 9.0) == []
    lost = book.missing(["a"], 10.0)
    assert [(w.client_id, w.sent, w.failed, w.scheduled, w.last_seen_unix, w.lost_unix) for w in lost] == [
        ("b", 1, 0, 40, 8.0, 10.0)
    ]
    assert book.missing(["a"], 11.0) == []  # said once
    assert [(w["index"], w["sent"], w["failed"]) for w in book.summary()] == [(0, 3, 1), (1, 1, 0)]
    assert book.workers["b"].name == "gen_1-11"


def test_a_lost_worker_leaves_exactly_its_share_from_the_loss_on_unsent() -> None:
    schedule = np.sort(np.random.default_rng(3).uniform(0, 100, 301))
    total, index, at = 3, 1, 40.0
    mask = lost_arrivals(schedule, index, total, at)
    mine = set(worker_share(len(schedule), index, total).tolist())
    assert set(np.flatnonzero(mask).tolist()) == {i for i in mine if schedule[i] >= at}
    assert 0 < mask.sum() < len(mine)
    assert not lost_arrivals(schedule, index, total, 101.0).any()


def test_a_worker_may_only_name_its_pacing_or_exhausted_file() -> None:
    assert FILE_NAME.match("gen1-123.pacing.json") and FILE_NAME.match("gen1-123.exhausted")
    for bad in ("../x.pacing.json", "a/b.exhausted", "x.jsonl", "gen1-123.pacing.json/../../y.exhausted"):
        assert not FILE_NAME.match(bad), bad
    assert safe_host("node/7 a") == "node_7_a" and safe_host("") == "host"


def test_specsoak_worker_refuses_a_master_that_is_not_host_colon_port() -> None:
    from tests.cli_inprocess import cli_inprocess

    for bad in ("10.0.0.1", "10.0.0.1:", ":5557", "10.0.0.1:port", "10.0.0.1:70000"):
        r = cli_inprocess("worker", "--master", bad)
        assert r.returncode == 2 and "expected HOST:PORT" in r.stdout + r.stderr, (bad, r.stdout, r.stderr)
