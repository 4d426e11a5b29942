"""Engine start-up logs, failure reasons, error answers and per-request speculative stats, for every engine."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.common import (
    ALL_ENGINES,
    ERROR_BODIES,
    FINAL_CHUNKS,
    KEY_LINES,
    LOG_SEEDS,
    check_classify,
    check_spec_stats,
    check_startup_log,
    chunk_dicts,
    fuzz,
    mutated_bytes,
    mutated_json,
    renumbered_lines,
    text_of,
)

# every engine's parser reads every engine's logs: `specsoak inspect-log` tries them all for its hint
logs = renumbered_lines(KEY_LINES).map(text_of) | mutated_bytes(LOG_SEEDS).map(text_of) | st.text(max_size=2000)


@fuzz
@given(text=logs)
def test_any_log_parses(text: str) -> None:
    for engine in ALL_ENGINES:
        check_startup_log(engine, text)


@fuzz
@given(
    status=st.integers(-1, 999) | st.sampled_from([400, 413, 422, 429, 500, 503]),
    body=st.text(max_size=300)
    | st.sampled_from(ERROR_BODIES)
    | mutated_bytes([b.encode() for b in ERROR_BODIES]).map(text_of),
)
def test_any_error_answer_classifies(status: int, body: str) -> None:
    for engine in ALL_ENGINES:
        check_classify(engine, status, body)


@fuzz
@given(chunk=mutated_json(FINAL_CHUNKS) | chunk_dicts)
def test_any_final_chunk_gives_stats(chunk: Any) -> None:
    if isinstance(chunk, dict):  # StreamParser hands over only JSON objects
        json.dumps(chunk)
        for engine in ALL_ENGINES:
            check_spec_stats(engine, chunk)
