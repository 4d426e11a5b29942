"""Records files (harness/records/files.py read_jsonl) and the report's loader (harness/report/load.py) on
torn, corrupt, binary and wrong-typed lines and on damaged run folders (a copy of tests/fixtures/run_quick)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from harness.report.load import PHASE_FIELDS, REQUEST_FIELDS
from tests.fuzz.common import (
    FIXTURES,
    JSONL_SEEDS,
    check_read_jsonl,
    check_run_folder,
    fuzz,
    json_values,
    mutated_bytes,
    mutated_json,
)

RUN = FIXTURES / "run_quick"
RECORDS = [json.loads(ln) for s in JSONL_SEEDS for ln in s.decode().splitlines()[:20]]


@contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="specsoak-fuzz-") as d:
        yield Path(d)


@st.composite
def record_lines(draw: st.DrawFn) -> bytes:
    """Records with wrong-typed or missing fields, lines of any JSON, with or without the last newline."""
    items = draw(st.lists(mutated_json(RECORDS) | json_values, max_size=10))
    text = b"\n".join(json.dumps(i).encode() for i in items)
    return text + draw(st.sampled_from([b"\n", b"", b"\r\n", b"\n\n"]))


@fuzz
@given(
    data=mutated_bytes(JSONL_SEEDS) | record_lines() | st.binary(max_size=300),
    require=st.sampled_from([None, REQUEST_FIELDS, PHASE_FIELDS, {"config": str}]),
)
def test_any_records_file_is_read_or_told(data: bytes, require: Any) -> None:
    with scratch() as d:
        path = d / "requests.jsonl"
        path.write_bytes(data)
        check_read_jsonl(path, require)


FILES = [
    "manifest.json",
    "phases.jsonl",
    "requests.jsonl",
    "failures.jsonl",
    "capacity/baseline.json",
    "capacity/ngram-map-k.json",
    "soak/r0.jsonl",
    "soak/r1.jsonl",
]


@st.composite
def damage(draw: st.DrawFn, size: int) -> tuple[str, Any]:
    op = draw(st.sampled_from(["delete", "empty", "truncate", "append", "binary", "line", "json"]))
    if op == "truncate":
        return op, draw(st.integers(0, size))
    if op in ("append", "binary"):
        return op, draw(st.binary(max_size=200) | st.sampled_from([b"\xff\xfe\x00", b"9" * 5000, b"[" * 5000]))
    if op == "line":
        return op, (draw(st.integers(0, 30)), json.dumps(draw(mutated_json(RECORDS) | json_values)).encode())
    if op == "json":
        return op, json.dumps(draw(json_values)).encode()
    return op, None


def _apply(path: Path, op: str, arg: Any) -> None:
    if op == "delete":
        path.unlink(missing_ok=True)
    elif op == "empty":
        path.write_bytes(b"")
    elif op == "truncate":
        path.write_bytes(path.read_bytes()[:arg])
    elif op == "append":
        path.write_bytes(path.read_bytes() + arg)
    elif op == "binary":
        path.write_bytes(arg)
    elif op == "line":
        lines = path.read_bytes().split(b"\n")
        n, line = arg
        lines[min(n, len(lines) - 1)] = line
        path.write_bytes(b"\n".join(lines))
    elif op == "json":
        path.write_bytes(arg + b"\n")


@fuzz
@given(data=st.data())
def test_damaged_run_folder_loads_or_is_a_results_error(data: st.DataObject) -> None:
    with scratch() as d:
        run = d / "run"
        shutil.copytree(RUN, run)
        (run / "soak").mkdir()
        requests = (RUN / "requests.jsonl").read_bytes().split(b"\n")
        (run / "soak" / "r0.jsonl").write_bytes(b"\n".join(requests[:25]) + b"\n")
        (run / "soak" / "r1.jsonl").write_bytes(b"\n".join(requests[25:40]) + b"\n")
        for name in data.draw(st.lists(st.sampled_from(FILES), min_size=1, max_size=4)):
            path = run / name
            if path.exists():
                _apply(path, *data.draw(damage(path.stat().st_size)))
        check_run_folder(run)
