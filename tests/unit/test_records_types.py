"""Typed records (harness/records/types.py): every line and manifest of real run folders reads and writes back byte for
byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.common.errors import ResultsError
from harness.records.files import JsonlWriter, RequestRecord, read_manifest
from harness.records.types import (
    ConfigState,
    Failure,
    JsonRecord,
    Manifest,
    Phase,
    SoakWindow,
    Verdict,
    VerifyState,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KINDS: dict[str, type[JsonRecord]] = {
    "verdicts.jsonl": Verdict,
    "windows.jsonl": SoakWindow,
    "failures.jsonl": Failure,
    "phases.jsonl": Phase,
    "after_soak.jsonl": Phase,
}
RUNS = [FIXTURES / "run_quick", FIXTURES / "run_soak_cache"]
FILES = [
    *sorted(p for p in (FIXTURES / "soak_records").glob("*/*.jsonl") if p.name in KINDS),
    *(run / name for run in RUNS for name in KINDS if (run / name).is_file()),
]


def _line(record: dict) -> str:
    """A record as JsonlWriter writes it."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False, default=str)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_real_record_round_trips_to_the_same_line(path: Path) -> None:
    cls = KINDS[path.name]
    for line in path.read_text().splitlines():
        rec = cls.from_dict(json.loads(line))
        assert _line(rec.to_dict()) == line
        assert _line(cls.from_dict(rec.to_dict()).to_dict()) == line


def test_the_fixtures_hold_records_of_every_type() -> None:
    seen = {p.name for p in FILES if p.read_text().strip()}
    assert seen == set(KINDS)


def test_named_fields_are_typed_and_the_rest_kept_in_extra() -> None:
    line = (FIXTURES / "soak_records" / "stalls" / "windows.jsonl").read_text().splitlines()[0]
    w = SoakWindow.from_dict(json.loads(line))
    assert isinstance(w.t_unix, float) and w.config and w.slice
    assert "detectors" in w.extra and "count_sd" in w.extra and "t_unix" not in w.extra
    assert w.get("count_sd") == w.extra["count_sd"] and w.get("requests") == w.requests


def test_unknown_keys_survive_and_missing_optional_keys_are_not_added() -> None:
    old = {
        "t_unix": 1.0,
        "config": "c",
        "slice": "s",
        "kind": "crash",
        "metric": None,
        "message": "m",
        "evidence": {},
        "action": "restart",
    }
    v = Verdict.from_dict(old)
    assert v.to_dict() == old and list(v.to_dict()) == list(
        old
    )  # an older verdict without engine_uptime_s / engine_pid
    assert v.engine_pid is None and v.get("engine_pid") is None
    newer = {**old, "brand_new": {"x": 1}, "engine_pid": 7}
    assert list(Verdict.from_dict(newer).to_dict().items()) == list(newer.items())
    v.extra["added"] = 1
    assert list(v.to_dict())[-1] == "added"


def test_a_required_field_missing_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="kind"):
        Verdict.from_dict({"t_unix": 1.0, "config": "c"})
    with pytest.raises(ValueError, match="t_start_unix"):
        SoakWindow.from_dict({"config": "c", "slice": "s"})


def test_a_verdict_built_in_code_writes_the_soaks_keys_and_its_failure_adds_stage_and_time(tmp_path: Path) -> None:
    v = Verdict(
        5.0, "spec", "spec-s001", "hang", None, "no answer for 30 s", {"silent_s": 30.0}, "restart", 120.0, 4242
    )
    assert list(v.to_dict()) == [
        "t_unix",
        "config",
        "slice",
        "kind",
        "metric",
        "message",
        "evidence",
        "action",
        "engine_uptime_s",
        "engine_pid",
    ]
    f = v.failure()
    assert f.to_dict() == {**v.to_dict(), "stage": "soak", "unix_s": 5.0}
    assert (f.config, f.stage, f.kind, f.unix_s) == ("spec", "soak", "hang", 5.0) and f.extra["engine_pid"] == 4242
    with JsonlWriter(tmp_path / "v.jsonl") as w:
        w.write(v.to_dict())
    assert Verdict.from_dict(json.loads((tmp_path / "v.jsonl").read_text())) == v


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_real_manifest_round_trips_with_its_configurations_typed(run: Path) -> None:
    text = (run / "manifest.json").read_text()
    m = read_manifest(run)
    assert json.dumps(m.to_dict(), indent=2) == json.dumps(json.loads(text), indent=2)  # same keys, same order
    assert m.run_id and m.engine == "llamacpp" and m.status and isinstance(m.started_unix, float)
    assert m.configurations and all(isinstance(c, ConfigState) for c in m.configurations.values())
    assert all(c.status == "done" and c.algorithm for c in m.configurations.values())
    assert m.scenario_file and m.scenario_parsed["name"] == m.scenario and m.verify is None


@pytest.mark.parametrize("run", RUNS[:1], ids=lambda p: p.name)
def test_a_verify_added_to_a_run_is_typed_and_written_after_the_runs_keys(run: Path) -> None:
    m = read_manifest(run)
    keys = list(m.to_dict())
    m.verify = VerifyState(started_unix=1.0, streams=2, prompts=["p1"], max_tokens=16, seed=0, status="running")
    m.verify.status, m.verify.all_identical = "completed", False
    out = m.to_dict()
    assert list(out) == [*keys, "verify"]
    assert out["verify"] == {
        "started_unix": 1.0,
        "streams": 2,
        "prompts": ["p1"],
        "max_tokens": 16,
        "seed": 0,
        "status": "completed",
        "stopped_unix": None,
        "all_identical": False,
        "reason": None,
    }
    back = Manifest.from_dict(json.loads(json.dumps(out)))
    assert back.verify == m.verify and back.to_dict() == out
    with pytest.raises(ValueError, match="verify is not an object"):
        Manifest.from_dict({**out, "verify": 3})


def test_a_field_set_after_reading_is_written_and_an_unset_one_is_not() -> None:
    m = Manifest.from_dict({"run_id": "r", "configurations": {"a": {"status": "pending"}}})
    assert m.to_dict() == {"run_id": "r", "configurations": {"a": {"status": "pending"}}}, "no defaults added"
    m.configurations["a"].update(status="done", algorithm="none", engine_exit=0)
    m.stop_reason = "done"
    assert m.to_dict() == {
        "run_id": "r",
        "configurations": {"a": {"status": "done", "algorithm": "none", "engine_exit": 0}},
        "stop_reason": "done",
    }
    assert m.get("stop_reason") == "done" and m.get("engine") is None and m.configurations["a"].get("k") is None
    old = Manifest.from_dict({"run_id": "old"})  # written before configurations were kept: none added on write
    assert old.configurations == {} and old.to_dict() == {"run_id": "old"}


@pytest.mark.parametrize(
    "text",
    ['{"configurations": 3}', '{"configurations": {"a": 3}}', "[]", '{"run_id": '],
)
def test_a_manifest_that_is_not_one_is_a_results_error_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ResultsError, match=r"manifest\.json: unreadable manifest"):
        read_manifest(tmp_path)


def test_a_phase_is_keyed_by_its_open_loop_load_or_its_stream_count() -> None:
    closed = Phase.from_dict({"config": "c", "phase": "measure", "streams": 4, "repetition": 1})
    opened = Phase.from_dict({"config": "c", "phase": "arrivals", "streams": 4, "repetition": 2, "load": "2rps"})
    assert (closed.load_key, opened.load_key) == (4, "2rps")
    assert closed.to_dict() == {"config": "c", "phase": "measure", "streams": 4, "repetition": 1}


def test_request_lines_read_back_as_records_and_drop_keys_they_do_not_name() -> None:
    line = json.loads((FIXTURES / "run_quick" / "requests.jsonl").read_text().splitlines()[0])
    r = RequestRecord.from_dict({**line, "added_later": 1})
    back = r.to_dict()  # an older line: the fields it lacked at their defaults
    assert {k: back[k] for k in line} == line and "added_later" not in back
    with pytest.raises(TypeError):
        RequestRecord.from_dict({"config": "c"})
