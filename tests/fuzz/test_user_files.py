"""Files users hand the harness: prompt files (harness/prompts load_prompts) and replay traces
(harness/load/shapes.py load_trace). Each loads, or its error names the file and the line."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.common import (
    PROMPT_SEEDS,
    TRACE_SEEDS,
    check_prompts,
    check_trace,
    fuzz,
    json_values,
    mutated_bytes,
    mutated_json,
)

PROMPTS = [json.loads(ln) for ln in PROMPT_SEEDS[0].decode().splitlines()]
KEYS = ["id", "messages", "conversations", "followups", "role", "content", "from", "value", "t_s", "prompt_id"]
values = st.recursive(json_values, lambda c: st.dictionaries(st.sampled_from(KEYS), c, max_size=4), max_leaves=12)


@st.composite
def json_files(draw: st.DrawFn, seeds: list[object]) -> bytes:
    items = draw(st.lists(mutated_json(seeds) | values, max_size=6))
    if draw(st.booleans()):
        return json.dumps(items, indent=draw(st.sampled_from([None, 1]))).encode()  # a JSON list
    return b"\n".join(json.dumps(i).encode() for i in items) + b"\n"


def _check(data: bytes, name: str, check: Callable[[Path], object]) -> None:
    with tempfile.TemporaryDirectory(prefix="specsoak-fuzz-") as d:
        path = Path(d) / name
        path.write_bytes(data)
        check(path)


@fuzz
@given(data=mutated_bytes(PROMPT_SEEDS) | json_files(PROMPTS) | st.binary(max_size=200))
def test_any_prompt_file_loads_or_names_its_line(data: bytes) -> None:
    _check(data, "prompts.jsonl", check_prompts)


TRACE = [{"t_s": 0.5, "prompt_id": "qa-tides"}, {"t_s": 2}]


@fuzz
@given(data=mutated_bytes(TRACE_SEEDS) | json_files(TRACE) | st.binary(max_size=200))
def test_any_trace_loads_or_names_its_line(data: bytes) -> None:
    _check(data, "trace.jsonl", check_trace)
