"""SSE stream parsing (harness/load/client.py StreamParser) for every engine: any bytes, split anywhere."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.common import (
    ALL_ENGINES,
    SSE_SEEDS,
    chunk_dicts,
    cut_points,
    fuzz,
    json_values,
    mutated_bytes,
    mutated_json,
    run_stream,
)

FINAL = [json.loads(ln[6:]) for s in SSE_SEEDS for ln in s.decode().splitlines() if ln.startswith("data: {")]


@st.composite
def random_json_streams(draw: st.DrawFn) -> bytes:
    """``data:`` lines holding arbitrary JSON: chunk-shaped objects, mutated real chunks, any value."""
    items: list[Any] = draw(st.lists(chunk_dicts | mutated_json(FINAL) | json_values, max_size=8))
    lines = [b"data: " + json.dumps(i).encode() for i in items]
    if draw(st.booleans()):
        lines.append(b"data: [DONE]")
    return b"\n\n".join(lines) + draw(st.sampled_from([b"\n\n", b"\n", b""]))


streams = mutated_bytes(SSE_SEEDS) | random_json_streams() | st.binary(max_size=512)


@fuzz
@given(data=st.data(), stream=streams, per_line=st.booleans())
def test_any_stream_makes_a_record(data: st.DataObject, stream: bytes, per_line: bool) -> None:
    blocks = data.draw(cut_points(stream))
    for engine in ALL_ENGINES:
        run_stream(engine, blocks, per_line=per_line)


@fuzz
@given(data=st.data(), stream=mutated_bytes(SSE_SEEDS, huge=False) | random_json_streams())
def test_split_anywhere_same_record(data: st.DataObject, stream: bytes) -> None:
    blocks = data.draw(cut_points(stream))
    for engine in ALL_ENGINES:
        assert run_stream(engine, blocks, tick=0).to_dict() == run_stream(engine, [stream], tick=0).to_dict()


@fuzz
@given(seed=st.sampled_from(SSE_SEEDS), times=st.integers(2, 4), cut=st.integers(0, 99))
def test_repeated_and_truncated_seed(seed: bytes, times: int, cut: int) -> None:
    for engine in ALL_ENGINES:
        rec = run_stream(engine, [seed * times])
        if b"[DONE]" in seed:
            assert rec == run_stream(engine, [seed])  # a stream ends at its first [DONE]
        truncated = run_stream(engine, [seed[: len(seed) * cut // 100]])
        assert (
            truncated.status == "error" or b"[DONE]" in seed[: len(seed) * cut // 100] or b'"finish_reason":"' in seed
        )
