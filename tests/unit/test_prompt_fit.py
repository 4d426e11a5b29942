"""The measurement leaves out prompts longer than one slot (harness/prompts/fit.py). The staged 30-minute soak's 4-stream
phases each lost one request to ``context_overflow``: a builtin:conversations prompt of about 2,750 tokens against a
2,048-token slot (docs/soak.md)."""

from __future__ import annotations

from pathlib import Path

from harness.prompts import Prompt, load_prompts
from harness.prompts.fit import TEMPLATE_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE, cache_path, counted_tokens, fit, write


class WordCount:
    """One token per blank-separated word: counts known exactly."""

    def tokenize(self, text: str) -> list[int]:
        return [0] * len(text.split())

    def detokenize(self, tokens: list[int]) -> str:
        raise AssertionError("fit never detokenizes")


def words(pid: str, n: int, max_tokens: int | None = None) -> Prompt:
    return Prompt(pid, [{"role": "user", "content": "w " * n}], max_tokens=max_tokens)


OVERHEAD = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE


def test_a_prompt_longer_than_the_slot_is_left_out_and_the_next_one_taken_in_its_place() -> None:
    source = [words("a", 100), words("long", 2_000), words("b", 100), words("c", 100), words("d", 5_000)]
    got = fit(source, WordCount(), slot_tokens=2_048, max_tokens=64, need=3)
    assert [p.id for p in got.prompts] == ["a", "b", "c", "d"]  # d was not checked: the phases take three
    assert got.left_out == [("long", 2_000 + OVERHEAD)] and got.kept == 3
    short = fit(source[:3], WordCount(), slot_tokens=2_048, max_tokens=64, need=3)
    assert short.kept == 2  # the set ran out: with prompt_reuse forbid the run says so (harness/run/phases.py)


def test_the_answer_and_the_template_count_against_the_slot() -> None:
    limit = 2_048 - 64 - OVERHEAD
    source = [words("edge", limit), words("over", limit + 1), words("own", limit, max_tokens=65)]
    got = fit(source, WordCount(), slot_tokens=2_048, max_tokens=64, need=3)
    assert [p.id for p in got.prompts] == ["edge"]
    assert [i for i, _ in got.left_out] == ["over", "own"]  # its own answer length, not the scenario's
    two_turns = Prompt("t", [{"role": "system", "content": "w w"}, {"role": "user", "content": "w"}])
    assert counted_tokens(two_turns, WordCount()) == 3 + TEMPLATE_TOKENS + 2 * TEMPLATE_TOKENS_PER_MESSAGE


def test_when_no_prompt_fits_none_is_kept_so_the_engine_refuses_and_says_why() -> None:
    got = fit([words("a", 300), words("b", 400)], WordCount(), slot_tokens=256, max_tokens=8, need=2)
    assert got.prompts == [] and got.kept == 0 and [i for i, _ in got.left_out] == ["a", "b"]


def test_the_kept_list_reads_back_the_same_with_what_was_left_out_said_in_its_first_line(tmp_path: Path) -> None:
    got = fit([words("a", 10), words("long", 3_000), words("b", 10)], WordCount(), 2_048, 64, need=2)
    path = cache_path(tmp_path, "m.gguf", "builtin:conversations", 64, 2)
    write(path, got)
    assert load_prompts(str(path), path.parent) == got.prompts
    assert '"left_out": [{"id": "long", "tokens": 3056}]' in path.read_text().splitlines()[0]
    assert cache_path(tmp_path, "other.gguf", "builtin:conversations", 64, 2) != path  # one per target model
