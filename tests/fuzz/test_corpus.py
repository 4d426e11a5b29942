"""The fuzz corpus (tests/fuzz/corpus/<parser>/<name>): inputs that once broke a parser, or notable edge
cases, replayed on every run; corpus/README.md says what each one broke."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from engines._common import Samples
from harness.common.errors import ScrapeError
from harness.load.shapes import load_trace
from harness.prompts import PromptError, load_prompts
from harness.report.load import REQUEST_FIELDS
from tests.fuzz.common import (
    ALL_ENGINES,
    CORPUS,
    FIXTURES,
    check_metrics,
    check_prompts,
    check_read_jsonl,
    check_run_folder,
    check_spec_stats,
    check_startup_log,
    check_trace,
    run_stream,
    text_of,
)

CASES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())
NOTES = dict(re.findall(r"^- `([^`]+)`: (.+)$", (CORPUS / "README.md").read_text(), re.MULTILINE))


def _sse(path: Path, tmp: Path) -> None:
    data = path.read_bytes()
    for engine in ALL_ENGINES:
        whole = run_stream(engine, [data], tick=0)
        assert run_stream(engine, [data[i : i + 7] for i in range(0, len(data), 7)], tick=0) == whole
        run_stream(engine, [data], per_line=True)


def _spec_stats(path: Path, tmp: Path) -> None:
    import json

    for engine in ALL_ENGINES:
        check_spec_stats(engine, json.loads(path.read_text()))


def _startup_log(path: Path, tmp: Path) -> None:
    for engine in ALL_ENGINES:
        check_startup_log(engine, text_of(path.read_bytes()))


def _metrics(path: Path, tmp: Path) -> None:
    text = text_of(path.read_bytes())
    for engine in ALL_ENGINES:
        check_metrics(engine, text)
    with contextlib.suppress(ScrapeError):
        Samples(text, "corpus")


def _records(path: Path, tmp: Path) -> None:
    shutil.copy(path, tmp / "requests.jsonl")
    assert check_read_jsonl(tmp / "requests.jsonl", REQUEST_FIELDS) and check_read_jsonl(tmp / "requests.jsonl", None)


def _run(place: str) -> Callable[[Path, Path], None]:
    def replay(path: Path, tmp: Path) -> None:
        run = tmp / "run"
        shutil.copytree(FIXTURES / "run_quick", run)
        (run / place).parent.mkdir(exist_ok=True)
        shutil.copy(path, run / place)
        data = check_run_folder(run)
        if place.startswith("soak/"):  # soak records are columns: a wrong-typed value is left empty, the record kept
            objects = sum(line.startswith(b"{") for line in path.read_bytes().split(b"\n"))
            assert data is not None and len(data.soak_requests) == objects
        elif (
            place != "manifest.json"
        ):  # only a bad manifest makes the folder unreadable; other files are skipped and told
            assert data is not None and any(place in m for m in data.read_log.messages(run)), (
                data and data.read_log.messages(run)
            )

    return replay


def _prompts(path: Path, tmp: Path) -> None:
    shutil.copy(path, tmp / path.name)
    check_prompts(tmp / path.name)


def _trace(path: Path, tmp: Path) -> None:
    shutil.copy(path, tmp / path.name)
    check_trace(tmp / path.name)


REPLAY: dict[str, Callable[[Path, Path], None]] = {
    "sse": _sse,
    "spec_stats": _spec_stats,
    "startup_log": _startup_log,
    "metrics": _metrics,
    "records": _records,
    "run_capacity": _run("capacity/corpus.json"),
    "run_manifest": _run("manifest.json"),
    "run_soak": _run("soak/corpus.jsonl"),
    "prompts": _prompts,
    "trace": _trace,
}


def test_every_corpus_file_has_a_note_and_a_replay() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in CASES}
    assert names == set(NOTES), names ^ set(NOTES)
    assert {p.parent.name for p in CASES} <= set(REPLAY)


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_replays(path: Path, tmp_path: Path) -> None:
    REPLAY[path.parent.name](path, tmp_path)


# what a few of them must give, beyond "no crash"
def test_corpus_named_outcomes(tmp_path: Path) -> None:
    def prompt_error(name: str) -> str:
        shutil.copy(CORPUS / "prompts" / name, tmp_path / name)
        with pytest.raises(PromptError) as exc:
            load_prompts(str(tmp_path / name), tmp_path)
        return str(exc.value)

    assert prompt_error("list_item_on_line_10.json").startswith(f"{tmp_path / 'list_item_on_line_10.json'}:10: ")
    assert prompt_error("not_utf8.jsonl").startswith(f"{tmp_path / 'not_utf8.jsonl'}:2: not UTF-8")
    assert prompt_error("message_without_content.jsonl").endswith(":1: every message needs 'role' and 'content'")
    shutil.copy(CORPUS / "prompts" / "line_separator_in_content.jsonl", tmp_path / "ls.jsonl")
    assert load_prompts(str(tmp_path / "ls.jsonl"), tmp_path)[0].messages[0]["content"] == "a\u2028b"
    for name, line in (
        ("t_s_nan.jsonl", 2),
        ("t_s_negative.jsonl", 2),
        ("prompt_id_list.jsonl", 1),
        ("not_utf8.jsonl", 2),
    ):
        with pytest.raises(ValueError, match=rf"{re.escape(name)}:{line}: "):
            load_trace(CORPUS / "trace" / name)
    rec = run_stream(ALL_ENGINES[0], [(CORPUS / "sse" / "usage_counts_nan.sse").read_bytes()])
    assert rec.status == "ok" and rec.prompt_tokens is None and rec.output_tokens == 1
    assert (
        run_stream(ALL_ENGINES[0], [(CORPUS / "sse" / "choices_is_a_string.sse").read_bytes()]).error_kind
        == "malformed"
    )
