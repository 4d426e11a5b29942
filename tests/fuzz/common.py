"""What the fuzz tests share: seeds from the real captures, mutation strategies, and the property each
parser must keep (``check_*``), used by the hypothesis tests and by the corpus replay alike.

The property: no input makes a parser raise anything but its own documented error (which names what it
rejected), and none makes it hang (the profile's deadline, tests/fuzz/conftest.py).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st

from engines import ENGINES
from engines.base import Engine
from engines.types import Capacity, EngineCounters, RequestSpecStats, acceptance_figures, counters_delta
from harness.common.errors import ResultsError, ScrapeError
from harness.load.client import ERROR_KINDS, StreamParser, classify_http
from harness.load.shapes import load_trace
from harness.prompts import PromptError, load_prompts
from harness.records.files import ReadLog, RequestRecord, read_jsonl
from harness.report.load import REQUEST_FIELDS, RunData, load_run
from tests.conftest import http_body
from tests.fuzz.conftest import PROFILE

F = TypeVar("F", bound=Callable[..., Any])
TESTS = Path(__file__).parents[1]
FIXTURES = TESTS / "fixtures"
CORPUS = Path(__file__).parent / "corpus"
PROMPT_SETS = TESTS.parent / "harness" / "prompts"
ENGINE_NAMES = sorted(ENGINES)
ALL_ENGINES = [ENGINES[n] for n in ENGINE_NAMES]  # every input goes to every engine's parser


def fuzz(f: F) -> F:
    """The active profile ("ci" unless SPECSOAK_FUZZ=long) on one fuzz test."""
    return settings(settings.get_profile(PROFILE))(f)  # type: ignore[no-any-return]  # hypothesis' settings() returns its argument


# ---- seeds: the real captures ----------------------------------------------------------------
def _files(*globs: str) -> list[Path]:
    return sorted({p for g in globs for p in FIXTURES.glob(g)})


def _sse(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n" if done else b""
    )


FINAL_CHUNKS: list[dict[str, Any]] = [json.loads(p.read_text()) for p in _files("*/stream_final_*.json")]
_LLAMA_STREAMS = [http_body(p.read_text()).encode() for p in _files("llamacpp/*.sse.txt")]
_TEXT_CHUNKS = [json.loads(ln[5:]) for ln in _LLAMA_STREAMS[0].decode().splitlines() if ln.startswith("data: {")][:6]
for _s in _LLAMA_STREAMS:  # llama-server's final usage chunk (with timings) too
    FINAL_CHUNKS += [
        json.loads(ln[5:]) for ln in _s.decode().splitlines() if ln.startswith("data: {") and '"usage"' in ln
    ]
SSE_SEEDS: list[bytes] = (
    _LLAMA_STREAMS
    + [_sse([*_TEXT_CHUNKS, c]) for c in FINAL_CHUNKS]
    + [_sse([json.loads(p.read_text())], done=False) for p in _files("*/error_*.json")]
)
ERROR_BODIES = [p.read_text() for p in _files("*/error_*.json")]
LOG_SEEDS: list[bytes] = [p.read_bytes() for p in _files("*/*.server.log", "*/*.startup_keylines.txt")]
METRICS_SEEDS: list[bytes] = [
    http_body(p.read_text()).encode() for p in _files("*/*.metrics.txt", "llamacpp/*GET_metrics*.txt")
]
JSONL_SEEDS: list[bytes] = [p.read_bytes() for p in _files("run_quick/*.jsonl")]
PROMPT_SEEDS: list[bytes] = [p.read_bytes() for p in sorted(PROMPT_SETS.glob("*.jsonl"))]
PROMPT_SEEDS.append(
    json.dumps([json.loads(ln) for ln in PROMPT_SEEDS[0].decode().splitlines()], indent=1).encode()
)  # a JSON list
TRACE_SEEDS: list[bytes] = [
    b'{"t_s": 0.5, "prompt_id": "qa-tides"}\n{"t_s": 2}\n\n{"t_s": 1.25, "prompt_id": "chat-greeting"}\n'
]

# ---- building blocks -------------------------------------------------------------------------
# pieces that broke (or nearly broke) parsers: junk numbers, bytes that are not UTF-8, deep nesting, huge runs
PIECES: list[bytes] = [
    b"\n",
    b"\r",
    b"\r\n",
    b"\x00",
    b"\xff\xfe",
    b"\xc3",
    b"\xed\xa0\x80",
    "\u00b2".encode(),
    "\u0663".encode(),
    "\u2028".encode(),
    b"data:",
    b"data: ",
    b"data: [DONE]\n",
    b"data: {}\n",
    b"data: null\n",
    b"data: []\n",
    b'data: {"error": 1}\n',
    b",",
    b".",
    b"1.2.3",
    b"-1",
    b"0",
    b"1e999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"+Inf",
    b"9" * 400,
    b"9" * 5000,
    b"[" * 2000,
    b"{" * 500,
    b'"',
    b"\\",
    b"}",
    b"]",
    b"#",
    b"# TYPE x counter\n",
    b'{position="99999999999"}',
]
HUGE: list[bytes] = [b"x" * 300_000, b"data: " + b"a" * 300_000, b"9" * 100_000, b"[" * 100_000, b"\xff" * 100_000]
NUMERIC_JUNK: list[bytes] = [
    b"",
    b",",
    b".",
    b"..",
    b"1.2.3",
    b"1,,2",
    b"-0",
    b"00",
    "\u00b9".encode(),
    "\u00b2".encode(),
    "\u0663".encode(),
    b"9" * 25,
    b"9" * 400,
    b"9" * 5000,
    b"1e400",
    b"nan",
    b"0.0",
]
_NUMBER = re.compile(rb"\d+(?:[.,]\d+)*")

# JSON values shaped like streamed chunks and final chunks: the keys the parsers look for, any values
CHUNK_KEYS = [
    "choices",
    "delta",
    "content",
    "finish_reason",
    "usage",
    "completion_tokens",
    "prompt_tokens",
    "error",
    "message",
    "code",
    "timings",
    "draft_n",
    "draft_n_accepted",
    "metrics",
    "speculative_decoding",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "sglext",
    "spec_tokens_details",
    "spec_num_proposed_drafts",
    "spec_num_correct_drafts",
    "spec_verify_ct",
    "meta_info",
]
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(
        ["12", "\u00b2", "1e5", "", "NaN", "-1", "9" * 5000, "stop", "length", 10**9, 2**31, 2**63, -1, 0]
    )
)
json_values = st.recursive(
    json_scalars,
    lambda c: (
        st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(CHUNK_KEYS) | st.text(max_size=4), c, max_size=5)
    ),
    max_leaves=20,
)
chunk_dicts = st.dictionaries(st.sampled_from(CHUNK_KEYS), json_values, max_size=6)


@st.composite
def mutated_json(draw: st.DrawFn, seeds: list[Any]) -> Any:
    """A seed JSON value with up to three values somewhere inside it replaced by arbitrary JSON."""
    obj = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 3))):
        holder, key = None, None
        node = obj
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            holder, key = node, draw(st.sampled_from(keys))
            node = holder[key]
        if holder is None:
            obj = draw(json_values) if draw(st.integers(0, 9)) == 0 else obj
        else:
            holder[key] = draw(json_values)
    return obj


@st.composite
def mutated_bytes(draw: st.DrawFn, seeds: list[bytes], max_ops: int = 6, huge: bool = True) -> bytes:
    """A real capture cut, spliced, repeated, renumbered and sprinkled with bad bytes."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, max_ops))):
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 4096)))
        op = draw(
            st.sampled_from(["delete", "insert", "piece", "repeat", "truncate", "splice", "renumber", "random", "huge"])
        )
        if op == "delete":
            del data[i:j]
        elif op == "insert":
            data[i:i] = draw(st.binary(max_size=64))
        elif op == "piece":
            data[i:i] = draw(st.sampled_from(PIECES))
        elif op == "repeat":
            data[i:i] = data[i:j][:2048] * draw(st.integers(2, 60))
        elif op == "truncate":
            del data[i:]
        elif op == "splice":  # a stretch of another capture (of any parser's seeds): phrases meet other numbers
            other = draw(st.sampled_from(seeds))
            a = draw(st.integers(0, len(other)))
            data[i:i] = other[a : a + draw(st.integers(0, 2048))]
        elif op == "renumber":
            spans = [m.span() for m in _NUMBER.finditer(data, i, min(len(data), i + 65536))]
            if spans:
                a, b = draw(st.sampled_from(spans[:200]))
                data[a:b] = draw(numeric_junk)
        elif op == "random":
            data[i:j] = draw(st.binary(min_size=j - i, max_size=j - i)) if j - i <= 64 else data[i:j]
        elif op == "huge" and huge:
            data[i:i] = draw(st.sampled_from(HUGE))
    return bytes(data)


def _key_lines() -> list[bytes]:
    """The lines of the log seeds that some engine's parser reads (they change its Capacity): junk
    numbers bite there, and a mutation that lands anywhere in a 180 KB log seldom reaches one."""
    empty = {name: e.parse_startup_log("") for name, e in ENGINES.items()}
    lines = sorted({ln for s in LOG_SEEDS for ln in s.splitlines()})
    return [ln for ln in lines if any(e.parse_startup_log(text_of(ln)) != empty[name] for name, e in ENGINES.items())]


numeric_junk = st.sampled_from(NUMERIC_JUNK) | st.integers(-(2**64), 2**64).map(lambda n: str(n).encode())


@st.composite
def renumbered_lines(draw: st.DrawFn, lines: list[bytes]) -> bytes:
    """A few of ``lines``, in any order, some of their numbers replaced by junk ('', '.', '1.2.3', 5000 digits)."""
    out = []
    for line in draw(st.lists(st.sampled_from(lines), min_size=1, max_size=8)):
        for _ in range(draw(st.integers(0, 2))):
            spans = [m.span() for m in _NUMBER.finditer(line)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                line = line[:a] + draw(numeric_junk) + line[b:]
        out.append(line)
    return b"\n".join(out)


def text_of(data: bytes) -> str:
    return data.decode("utf-8", "replace")  # as the harness reads logs and /metrics


@st.composite
def cut_points(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` split anywhere: how the network may hand it over."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    parts, last = [], 0
    for c in cuts:
        parts.append(data[last:c])
        last = c
    parts.append(data[last:])
    return parts


KEY_LINES = _key_lines()
METRICS_LINES = sorted({ln for s in METRICS_SEEDS for ln in s.splitlines() if ln and not ln.startswith(b"#")})

# ---- the properties ----------------------------------------------------------------------------
META = {"config": "c", "phase": "measure", "streams": 1, "repetition": 0, "stream": 0, "index": 0}
_COUNTS = ("output_tokens", "prompt_tokens", "draft_tokens", "accepted_tokens")


def _int_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def run_stream(engine: type[Engine], blocks: list[bytes], tick: int = 1000, per_line: bool = False) -> RequestRecord:
    """Feed ``blocks`` as the streaming client does (or line by line, as ``feed`` is called), build the record."""
    p = StreamParser(engine, True, 0)
    now, more = 0, True
    if per_line:
        for line in b"".join(blocks).split(b"\n"):
            now += tick
            if not p.feed(line, now):
                more = False
                break
        if more:
            p.end_of_stream()
    else:
        for block in blocks:
            now += tick
            if not p.feed_block(block, now):
                more = False
                break
        if more:
            p.end_of_block_stream(now + tick)
    rec = p.record(META, "p1", 1.0, now + 2 * tick + 1)
    check_record(rec)
    return rec


def check_record(rec: RequestRecord) -> None:
    assert isinstance(rec, RequestRecord)
    assert rec.status in ("ok", "error")
    assert (rec.status == "ok") == (rec.error_kind is None), rec
    assert rec.error_kind is None or rec.error_kind in ERROR_KINDS, rec.error_kind
    assert rec.error is None or isinstance(rec.error, str)
    assert all(_int_or_none(getattr(rec, f)) for f in _COUNTS), rec
    assert rec.finish_reason is None or isinstance(rec.finish_reason, str), rec.finish_reason
    assert rec.text is None or isinstance(rec.text, str)
    json.dumps(rec.to_dict(), allow_nan=False, default=str)  # what the records writers write


def check_startup_log(engine: type[Engine], text: str) -> Capacity:
    cap = engine.parse_startup_log(text)
    assert isinstance(cap, Capacity)
    assert isinstance(cap.recognised(), bool)
    assert cap.target.total_mib is None or isinstance(cap.target.total_mib, float)
    for f in ("slots", "ctx_per_slot", "ctx_total", "spec_n_max", "threads", "kv_blocks", "kv_block_tokens"):
        assert _int_or_none(getattr(cap, f)), (f, getattr(cap, f))
    back = Capacity.from_dict(json.loads(json.dumps(cap.to_dict())))  # a capacity record round trip
    assert isinstance(back, Capacity)
    reason = engine.failure_reason(text)
    assert reason is None or isinstance(reason, str)
    return cap


def check_metrics(engine: type[Engine], text: str) -> EngineCounters | None:
    try:
        c = engine.normalise_metrics(text)
    except ScrapeError as exc:
        assert str(exc).startswith(engine.name), exc
        return None
    assert isinstance(c, EngineCounters)
    assert len(c.accepted_per_position) <= 4096
    acceptance_figures(counters_delta(c, c))
    return c


def check_spec_stats(engine: type[Engine], chunk: dict[str, Any]) -> RequestSpecStats:
    s = engine.request_spec_stats(chunk)
    assert isinstance(s, RequestSpecStats)
    assert _int_or_none(s.draft_tokens) and _int_or_none(s.accepted_tokens), s
    return s


def check_classify(engine: type[Engine], status: int, body: str) -> None:
    kind = engine.classify_error(status, body)
    assert kind is None or kind in ERROR_KINDS, kind
    assert classify_http(status, body) in ERROR_KINDS


def lines_as_read(path: Path) -> int:
    """The lines ``read_jsonl`` sees in ``path``: every one must be read or told to the log."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = list(f)
    if lines and not lines[-1].endswith("\n") and not lines[-1].strip():
        return len(lines) - 1  # a torn tail of blanks: nothing to tell
    return len(lines)


def check_read_jsonl(
    path: Path, require: dict[str, type | tuple[type, ...]] | None = REQUEST_FIELDS
) -> list[dict[str, Any]]:
    log = ReadLog()
    records = list(read_jsonl(path, log, require))
    assert records == list(read_jsonl(path, None, require))
    for r in records:
        assert isinstance(r, dict)
        for k, t in (require or {}).items():
            assert isinstance(r[k], t), (k, r[k])
    skipped = log.files.get(path)
    assert len(records) + (skipped.lines if skipped else 0) == lines_as_read(path)
    if skipped:
        (message,) = log.messages(path.parent)
        assert (
            message.startswith(f"{path.name}: {skipped.lines} line")
            and f"the first at line {skipped.first_line} " in message
        )
    return records


def check_run_folder(run_dir: Path) -> RunData | None:
    try:
        data = load_run(run_dir)
    except ResultsError as exc:
        assert str(run_dir) in str(exc), exc
        return None
    assert isinstance(data, RunData)
    assert all(isinstance(m, str) for m in data.read_log.messages(run_dir))
    assert isinstance(data.run_id, str) and isinstance(data.config_names, list)
    return data


def check_prompts(path: Path) -> None:
    try:
        prompts = load_prompts(str(path), path.parent)
    except PromptError as exc:
        msg = str(exc)
        assert re.match(rf"{re.escape(str(path))}:\d+: \S", msg) or msg == f"{path}: no prompts", msg
        return
    assert prompts
    for p in prompts:
        assert isinstance(p.id, str) and p.messages and isinstance(p.followups, tuple)
        assert all(isinstance(m, dict) and set(m) == {"role", "content"} for m in p.messages)
        assert all(isinstance(v, str) for m in p.messages for v in m.values())
        assert all(isinstance(f, str) for f in p.followups)
        json.dumps(p.to_dict())  # what the soak hands its Locust processes


def check_trace(path: Path) -> None:
    try:
        trace = load_trace(path)
    except ValueError as exc:
        assert re.match(rf"{re.escape(str(path))}:\d+: \S", str(exc)), exc
        return
    assert [t for t, _ in trace] == sorted(t for t, _ in trace)
    for t, pid in trace:
        assert isinstance(t, float) and math.isfinite(t) and t >= 0, t
        assert pid is None or isinstance(pid, str), pid
    json.dumps(trace, allow_nan=False)
