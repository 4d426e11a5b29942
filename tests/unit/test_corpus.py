"""builtin:conversations: the realistic corpus (harness/prompts/build_corpus.py builds it from CPython's text)."""

from __future__ import annotations

import collections
import gzip
import json
import sys
from pathlib import Path

import pytest

from harness.prompts import build_corpus, load_prompts


@pytest.fixture(scope="module")
def corpus() -> list:
    return load_prompts("builtin:conversations", Path("."))


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    with gzip.open(build_corpus.OUT, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f][1:]  # the first line is _meta


def test_several_hundred_conversations_most_multi_turn(corpus: list) -> None:
    assert len(corpus) >= 500
    multi = sum(1 for p in corpus if p.followups)
    assert multi / len(corpus) >= 0.5
    assert max(len(p.followups) for p in corpus) >= 3


def test_code_and_prose_short_and_long(corpus: list, raw: list[dict]) -> None:
    kinds = collections.Counter(c["kind"] for c in raw)
    assert set(kinds) == {"code", "prose", "short", "doc", "long"}
    assert kinds["code"] >= 200 and kinds["prose"] >= 150 and kinds["short"] >= 100 and kinds["long"] >= 20
    with_code = sum(1 for p in corpus if "```python" in p.messages[0]["content"])
    assert 0.25 <= with_code / len(corpus) <= 0.75  # a mix, neither one kind
    lengths = sorted(len(p.messages[0]["content"]) for p in corpus)
    assert lengths[0] < 120 and lengths[-1] > 10_000  # one-liners and texts of thousands of tokens
    first = [c["kind"] for c in raw[:50]]
    assert len(set(first)) >= 4  # interleaved: a phase that takes the first prompts gets a mix


def test_no_duplicate_ids_or_texts(corpus: list) -> None:
    ids = [p.id for p in corpus]
    texts = [p.messages[0]["content"] for p in corpus]
    assert len(set(ids)) == len(ids)
    assert len(set(texts)) == len(texts)
    for p in corpus:  # a conversation never asks the same thing twice
        assert len(set(p.followups)) == len(p.followups)


def test_committed_file_is_what_the_script_builds() -> None:
    built = build_corpus.built_with()
    here = ".".join(map(str, sys.version_info[:3]))
    if built != here:
        pytest.skip(f"the corpus was built with Python {built}; this is {here} (its standard library is the text)")
    assert build_corpus.render(build_corpus.build()) == build_corpus.OUT.read_bytes()


def test_meta_line_is_skipped_but_a_bad_line_still_fails(tmp_path: Path) -> None:
    from harness.prompts import PromptError

    f = tmp_path / "p.jsonl"
    f.write_text('{"_meta": {"python": "3"}}\n{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    assert [p.id for p in load_prompts(str(f), tmp_path)] == ["a"]
    f.write_text('{"_meta": {}, "id": "x"}\n')
    with pytest.raises(PromptError, match="needs 'messages'"):
        load_prompts(str(f), tmp_path)
