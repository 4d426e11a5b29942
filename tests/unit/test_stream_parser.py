"""StreamParser (harness/load/client.py) over SSE streams: the real llama.cpp captures, and streams built
in their format (tests/fixtures/llamacpp/spec_self_draft.chat.stream_usage.sse.txt captured from
llama-server build 11434) with chunks that carry several tokens, as speculative engines stream
them. Figures: docs/metrics.md#per-request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engines.llamacpp import LlamaCpp
from harness.load.client import RequestParams, StreamParser, per_token_gaps, request_body
from harness.records.files import RequestRecord
from tests.conftest import LLAMACPP

# draft-simple, k=3, greedy: 11 text chunks, usage.completion_tokens 12 (the 12th is the end-of-sequence
# token, which has no text), timings.draft_n 8, draft_n_accepted 8
CAPTURE = LLAMACPP / "spec_self_draft.chat.stream_usage.sse.txt"
MS = 1_000_000
META = {"config": "c", "phase": "measure", "streams": 1, "repetition": 0, "stream": 0, "index": 0}


def capture_chunks() -> list[dict[str, Any]]:
    return [
        json.loads(ln[5:]) for ln in CAPTURE.read_text().splitlines() if ln.startswith("data:") and "[DONE]" not in ln
    ]


def line(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n"


def text_chunk(content: str, usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A text chunk as llama-server writes it in the capture (same keys, same order)."""
    template = capture_chunks()[1]
    chunk = {**template, "choices": [{"finish_reason": None, "index": 0, "delta": {"content": content}}], **extra}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def finish_and_usage(completion_tokens: int | None) -> list[dict[str, Any]]:
    """The capture's last two chunks: finish_reason, then usage + timings (or no usage at all)."""
    chunks = capture_chunks()
    finish, final = chunks[-2], dict(chunks[-1])
    assert finish["choices"][0]["finish_reason"] == "stop" and final["choices"] == []
    if completion_tokens is None:
        return [finish]
    final["usage"] = {**final["usage"], "completion_tokens": completion_tokens}
    return [finish, final]


def run(lines: list[tuple[bytes, int]], t_end_ns: int | None = None) -> RequestRecord:
    """Feed (line, arrival ns) pairs to a parser started at 0; the record."""
    p = StreamParser(LlamaCpp, True, 0)
    for raw, t in lines:
        if not p.feed(raw, t):
            break
    p.end_of_stream()
    return p.record(META, "p0", 1_700_000_000.0, t_end_ns if t_end_ns is not None else lines[-1][1])


def test_real_capture_one_token_per_chunk_even_when_drafts_are_accepted() -> None:
    chunks = capture_chunks()
    # chunk i (0 = the role chunk) arrives at 100 + 10·i ms
    rec = run([(line(c), (100 + 10 * i) * MS) for i, c in enumerate(chunks)] + [(b"data: [DONE]\n", 400 * MS)])
    assert rec.status == "ok" and rec.output_tokens == 12 and rec.chunks == 11 and rec.finish_reason == "stop"
    assert (rec.draft_tokens, rec.accepted_tokens) == (8, 8)
    # the prompt's 34 tokens, 33 of them from the prompt cache (usage.prompt_tokens_details): 1 to prefill
    assert (rec.prompt_tokens, rec.cached_tokens) == (34, 33)
    assert rec.chunk_tokens == [1] * 11  # 12 = 11 chunks + the end-of-sequence token: one token each
    assert rec.ttft_s == pytest.approx(0.110)
    assert rec.itl_s == [0.01] * 10
    assert rec.itl_token_p50_s == rec.itl_token_p99_s == 0.01  # one token per chunk: per token = per chunk
    # the 10 tokens after the first chunk, over 100 ms (the end-of-sequence token came after the last chunk)
    assert rec.decode_tps == pytest.approx(10 / 0.100)
    assert rec.text == "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_multi_token_chunks_from_running_usage() -> None:
    """Usage in every chunk (vLLM / SGLang with continuous_usage_stats): chunks of 2, 3, 1, 4, 2 tokens."""
    tokens = [2, 3, 1, 4, 2]
    arrivals_ms = [100, 160, 170, 250, 270]  # per-chunk gaps 60, 10, 80, 20 ms
    lines, total = [(line(capture_chunks()[0]), 50 * MS)], 0
    for n, t in zip(tokens, arrivals_ms, strict=True):
        total += n
        lines.append(
            (
                line(
                    text_chunk(
                        "x" * n, usage={"prompt_tokens": 34, "completion_tokens": total, "total_tokens": 34 + total}
                    )
                ),
                t * MS,
            )
        )
    lines += [(line(c), 280 * MS) for c in finish_and_usage(12)]
    rec = run(lines)
    assert rec.status == "ok" and rec.output_tokens == 12 and rec.chunks == 5
    assert rec.chunk_tokens == tokens
    assert rec.itl_s == [0.06, 0.01, 0.08, 0.02]  # per chunk: kept as it was
    # per token: 60/3 ×3, 10/1, 80/4 ×4, 20/2 ×2 ms
    assert per_token_gaps(rec.itl_s, rec.chunk_tokens[1:]) == pytest.approx(
        [0.02] * 3 + [0.01] + [0.02] * 4 + [0.01] * 2
    )
    assert rec.itl_token_p50_s == 0.02  # 10 entries: 3 of 10 ms, 7 of 20 ms
    assert rec.itl_token_p99_s == 0.02
    # decode t/s: the 10 tokens after the first chunk over 170 ms; the first chunk's 2 tokens are not in it
    assert rec.decode_tps == pytest.approx(10 / 0.170)
    assert rec.decode_tps != pytest.approx((12 - 1) / 0.170)


def test_per_token_percentiles_interpolate() -> None:
    tokens = [1, 1, 2, 1]
    arrivals_ms = [100, 110, 150, 180]  # per-token gaps: 10, 20, 20, 30 ms
    lines, total = [], 0
    for n, t in zip(tokens, arrivals_ms, strict=True):
        total += n
        lines.append((line(text_chunk("y", usage={"completion_tokens": total})), t * MS))
    lines += [(line(finish_and_usage(5)[0]), 190 * MS)]
    rec = run(lines)
    assert rec.chunk_tokens == tokens
    assert rec.itl_token_p50_s == 0.02
    assert rec.itl_token_p99_s == 0.0297  # rank 0.99 · 3 = 2.97: 20 + 0.97 · (30 − 20) ms


def test_llamacpp_timings_per_token_count_tokens() -> None:
    """llama.cpp with timings_per_token: each chunk's timings.predicted_n (format of
    base.completion.stream_timings_per_token.sse.txt) is the running count."""
    timings = json.loads(
        (LLAMACPP / "base.completion.stream_timings_per_token.sse.txt").read_text().split("\n")[0][5:]
    )["timings"]
    lines = [
        (line(text_chunk("a", timings={**timings, "predicted_n": n})), t * MS)
        for n, t in ((1, 100), (2, 110), (5, 140))
    ]
    rec = run(lines + [(line(c), 150 * MS) for c in finish_and_usage(5)])
    assert rec.chunk_tokens == [1, 1, 3]
    assert rec.itl_token_p50_s == 0.01 and rec.decode_tps == pytest.approx(4 / 0.040)


def test_stream_without_usage_counts_chunks() -> None:
    chunks = [c for c in capture_chunks() if not c.get("usage")]
    rec = run([(line(c), (100 + 10 * i) * MS) for i, c in enumerate(chunks)] + [(b"data: [DONE]\n", 300 * MS)])
    assert rec.status == "ok" and rec.output_tokens == 11 == rec.chunks  # the chunk count
    assert rec.prompt_tokens is None and rec.draft_tokens is None
    assert rec.chunk_tokens == [1] * 11 and rec.itl_token_p50_s == 0.01
    assert rec.decode_tps == pytest.approx(10 / 0.100)


def test_multi_token_chunks_without_counts_are_unknown_per_token() -> None:
    """Usage only at the end and more tokens than chunks: which chunk carried what is unknown."""
    lines = [(line(text_chunk("z")), t * MS) for t in (100, 130, 160, 190)]
    rec = run(lines + [(line(c), 200 * MS) for c in finish_and_usage(10)])
    assert rec.status == "ok" and rec.output_tokens == 10 and rec.chunks == 4
    assert rec.chunk_tokens is None and rec.itl_token_p50_s is None and rec.itl_token_p99_s is None
    assert rec.itl_s == [0.03] * 3
    assert rec.decode_tps == pytest.approx(9 / 0.090)  # the first chunk taken as one token


def test_a_chunk_with_no_new_token_passes_its_gap_on() -> None:
    counts = [1, 2, 2, 4]  # the third chunk is text held back from earlier tokens
    lines = [
        (line(text_chunk("w", usage={"completion_tokens": c})), t * MS)
        for c, t in zip(counts, (100, 110, 120, 150), strict=True)
    ]
    rec = run([*lines, (line(finish_and_usage(4)[0]), 160 * MS)])
    assert rec.chunk_tokens == [1, 1, 0, 2]
    assert per_token_gaps([10, 10, 30], [1, 0, 2]) == [10, 20, 20]
    assert rec.itl_token_p50_s == 0.02 and rec.decode_tps == pytest.approx(3 / 0.050)


def test_split_lines_and_utf8_take_the_time_of_the_read_that_completes_them() -> None:
    raw = b"".join(line(c) + b"\n" for c in capture_chunks()) + b"data: [DONE]"
    raw = raw.replace(b'"content":" Red"', '"content":" Rød"'.encode())  # a two-byte character to cut in half
    whole = StreamParser(LlamaCpp, True, 0)
    for ln in raw.split(b"\n"):
        whole.feed(ln, 1)
    for size in (1, 2, 7, 64, 333):
        p = StreamParser(LlamaCpp, True, 0)
        blocks = [raw[i : i + size] for i in range(0, len(raw), size)]
        for i, block in enumerate(blocks):
            p.feed_block(block, i + 1)
        p.end_of_block_stream(len(blocks) + 1)  # the last line had no newline
        assert p.done and p.kind is None, size
        assert "".join(p.parts) == "".join(whole.parts) and " Rød" in p.parts
        assert p.chunk_tokens == [None] * 11 and p.tokens_per_chunk() == [1] * 11
        # each chunk is stamped with the block that held its line's end
        ends, at = [], 0
        for _ in range(11):
            at = raw.index(b"\n", raw.index(b'"delta":{"content":"', at))
            ends.append(at)
        assert p.chunk_times == [e // size + 1 for e in ends], size


def test_a_line_without_newline_at_the_end_is_still_read() -> None:
    p = StreamParser(LlamaCpp, True, 0)
    assert p.feed_block(line(text_chunk("a")) + line(finish_and_usage(1)[0])[:-1], 5)
    assert p.finish is None
    p.end_of_block_stream(6)
    assert p.finish == "stop" and p.kind is None and p.chunk_times == [5]


def test_more_chunks_than_usage_is_duplicate() -> None:
    lines = [(line(text_chunk("d")), t * MS) for t in (100, 110, 120)]
    rec = run(lines + [(line(c), 130 * MS) for c in finish_and_usage(2)])
    assert rec.status == "error" and rec.error_kind == "duplicate"


def test_engine_stream_options_are_added_to_include_usage() -> None:
    body = request_body(
        [], RequestParams(max_tokens=4), {"stream_options": {"continuous_usage_stats": True}, "model": "m"}
    )
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True} and body["model"] == "m"
    assert request_body([], RequestParams(max_tokens=4), {})["stream_options"] == {"include_usage": True}


# ---- added after the mutation run (docs/testing.md): each kills mutants that survived it ---------------------------


def test_request_body_is_the_openai_chat_request() -> None:
    params = RequestParams(max_tokens=64, temperature=0.7, seed=40, ignore_eos=False)
    msgs = [{"role": "user", "content": "hi"}]
    assert request_body(msgs, params, {"cache_prompt": False}, seq=5) == {
        "messages": msgs,
        "max_tokens": 64,
        "temperature": 0.7,
        "seed": 45,
        "stream": True,
        "ignore_eos": False,
        "cache_prompt": False,
        "stream_options": {"include_usage": True},
    }


def test_times_are_taken_from_the_request_start() -> None:
    """t0 is not 0 here (perf_counter_ns never is): TTFT and e2e are differences from it."""
    t0 = 5_000 * MS
    p = StreamParser(LlamaCpp, False, t0)
    for raw, t in [(line(text_chunk("a")), t0 + 100 * MS), (line(text_chunk("b")), t0 + 150 * MS)]:
        p.feed(raw, t)
    for c in finish_and_usage(2):
        p.feed(
            line({**c, "usage": {**c.get("usage", {}), "prompt_tokens": 34}} if c.get("usage") else c), t0 + 160 * MS
        )
    rec = p.record(META, "p0", 1_700_000_000.1234567, t0 + 200 * MS)
    assert rec.status == "ok" and rec.text is None  # keep_text off
    assert rec.ttft_s == pytest.approx(0.100) and rec.e2e_s == pytest.approx(0.200)
    assert rec.e2e_tps == pytest.approx(2 / 0.200) and rec.prompt_tokens == 34
    assert rec.start_unix_s == 1_700_000_000.123457 and rec.prompt_id == "p0"
    assert rec.itl_s == [0.05] and rec.itl_token_p50_s == rec.itl_token_p99_s == 0.05  # one gap: both percentiles


def test_one_chunk_has_no_decode_speed_and_chunks_equal_to_usage_are_not_duplicates() -> None:
    rec = run([(line(text_chunk("a")), 100 * MS)] + [(line(c), 110 * MS) for c in finish_and_usage(1)])
    assert rec.status == "ok" and rec.decode_tps is None and rec.itl_s == [] and rec.itl_token_p50_s is None


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b'{"error":{"code":500,"message":"slot crashed","type":"server_error"}}', "server_error"),
        (
            b'{"error":{"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}}',
            "context_overflow",
        ),
        (b'{"error":"upstream gone"}', "server_error"),
        (b'{"choices":[{"delta":{"content":"x"', "malformed"),
        (b"[1, 2]", "malformed"),
    ],
)
def test_an_error_or_a_broken_chunk_ends_the_stream_as_a_failure(payload: bytes, kind: str) -> None:
    p = StreamParser(LlamaCpp, True, 0)
    assert p.feed_block(line(text_chunk("a")), 100 * MS)
    assert p.feed_block(b"data: " + payload + b"\n" + line(text_chunk("never read")), 110 * MS) is False
    rec = p.record(META, "p0", 0.0, 120 * MS)
    assert (rec.status, rec.error_kind) == ("error", kind) and rec.chunks == 1
    assert rec.error and (kind != "server_error" or "slot crashed" in rec.error or "upstream gone" in rec.error)


def test_a_stream_that_stops_without_finish_is_truncated_and_one_without_text_is_empty() -> None:
    p = StreamParser(LlamaCpp, True, 0)
    p.feed_block(line(text_chunk("a")), 100 * MS)
    p.end_of_block_stream(110 * MS)
    rec = p.record(META, "p0", 0.0, 120 * MS)
    assert (rec.status, rec.error_kind) == ("error", "truncated") and "1 chunks" in (rec.error or "")
    rec = run([(line(capture_chunks()[0]), 100 * MS)] + [(line(c), 110 * MS) for c in finish_and_usage(0)])
    assert (rec.status, rec.error_kind, rec.output_tokens, rec.ttft_s) == ("error", "empty", None, None)


def test_done_stops_the_block_and_a_last_text_line_without_newline_gets_the_final_time() -> None:
    p = StreamParser(LlamaCpp, True, 0)
    assert p.feed_block(line(text_chunk("a")) + b"data: [DONE]\n" + line(text_chunk("after")), 100 * MS) is False
    assert p.done and p.parts == ["a"]
    p = StreamParser(LlamaCpp, True, 0)
    p.feed_block(line(text_chunk("a")) + line(text_chunk("b"))[:-1], 100 * MS)
    p.end_of_block_stream(130 * MS)
    assert p.chunk_times == [100 * MS, 130 * MS] and p.parts == ["a", "b"]
