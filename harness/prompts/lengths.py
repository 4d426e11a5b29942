"""Synthetic lengths: prompts of drawn input and output lengths, cut from a prompt set's own text, with an
optional shared prefix (scenario: ``measurement.lengths``, ``soak.lengths``; docs/scenarios.md#synthetic-lengths).

Input lengths are counted in the target's tokens: the set's text is tokenized once through the engine's own
``/tokenize`` (``Engine.tokenize``), prompt i is the window of ``n_i`` tokens that starts where window i-1 ended
(wrapping with a shift, so no two windows are the same), turned back into text by ``/detokenize`` and tokenized
again: the window is widened or narrowed until that text is ``n_i`` tokens (or as close as four tries get). An engine
without a tokenizer endpoint gets lengths in words instead, and the build says so (``counted_in``). Output
lengths become each prompt's ``max_tokens``; requests ask ``ignore_eos`` (client.request_body), so the answer
is that long on engines that honour it. A source prompt's ``followups`` stay with the window built from it, so
multi-turn conversations keep their later turns.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.prompts import Prompt, PromptError

SOAK_DEFAULT_PROMPTS = 5000


class Tokenizer(Protocol):
    """The target's tokenizer, as the engine serves it (engines/base.py: Engine.tokenize / detokenize)."""

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


class WordTokenizer:
    """Lengths in words, for an engine with no tokenizer endpoint: a 'token' is a run of non-blank characters
    with the blank before it. Said in the build's ``counted_in``, never passed off as the target's tokens."""

    def __init__(self) -> None:
        self._words: list[str] = []
        self._ids: dict[str, int] = {}

    def tokenize(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self._ids:
                self._ids[w] = len(self._words)
                self._words.append(w)
            out.append(self._ids[w])
        return out

    def detokenize(self, tokens: list[int]) -> str:
        return " ".join(self._words[t] for t in tokens)


def draw(dist: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths from ``dist`` (a scenario.LengthDist), rounded and clipped to [min, max]."""
    lo, hi = dist.min, dist.max if dist.max is not None else 1 << 20
    if dist.dist == "fixed":
        x = np.full(n, float(dist.mean))
    elif dist.dist == "uniform":
        return rng.integers(lo, hi + 1, size=n)
    elif dist.dist == "normal":
        x = rng.normal(dist.mean, dist.sd, size=n)
    else:  # lognormal with the lengths' own mean and sd
        sigma2 = math.log1p((dist.sd / dist.mean) ** 2)
        x = rng.lognormal(math.log(dist.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


@dataclass
class Built:
    """Prompts built at drawn lengths, with what a report needs to say how they were made."""

    prompts: list[Prompt]
    counted_in: str  # "tokens" (the engine's /tokenize) or "words"
    input_drawn: list[int] = field(default_factory=list)  # per prompt; empty when input is the set's own prompts
    input_tokens: list[int] = field(
        default_factory=list
    )  # the built user turn, tokenized again (drawn, or within a few)
    output_drawn: list[int] = field(default_factory=list)
    prefix_tokens: int = 0

    def to_lines(self) -> list[str]:
        meta = {"_meta": {"counted_in": self.counted_in, "prefix_tokens": self.prefix_tokens}}
        lines = [json.dumps(meta)]
        for i, p in enumerate(self.prompts):
            d = p.to_dict()
            if self.input_drawn:
                d["input_drawn"], d["input_tokens"] = self.input_drawn[i], self.input_tokens[i]
            lines.append(json.dumps(d, ensure_ascii=False))
        return lines


def build(source: Sequence[Prompt], lengths: Any, count: int, tokenizer: Tokenizer | None) -> Built:
    """``count`` prompts shaped by ``lengths`` (a scenario.Lengths) from ``source``'s text."""
    if lengths.input is None:
        count = min(count, len(source))  # the set's own prompts: past its end they would only come round again
    tok: Tokenizer = tokenizer if tokenizer is not None else WordTokenizer()
    counted_in = "tokens" if tokenizer is not None else "words"
    rng = np.random.default_rng(lengths.seed & 0xFFFFFFFF)
    inputs = draw(lengths.input, count, rng) if lengths.input is not None else None
    outputs = draw(lengths.output, count, rng) if lengths.output is not None else None
    need = int(inputs.sum()) if inputs is not None else 0
    need_pool = max(need, int(inputs.max()) * 4 if inputs is not None else 0) + lengths.shared_prefix_tokens
    pool = _pool(source, tok, need_pool) if (inputs is not None or lengths.shared_prefix_tokens) else []

    prefix: list[dict[str, str]] = []
    body = pool
    if lengths.shared_prefix_tokens:
        n = lengths.shared_prefix_tokens
        if len(pool) < n + (int(inputs.max()) if inputs is not None else 0):
            raise PromptError(
                f"the prompt set's text is {len(pool)} {counted_in}: too short for a {n}-{counted_in} shared prefix and the prompts"
            )
        prefix = [
            {"role": "system", "content": tok.detokenize(pool[-n:])}
        ]  # the pool's end: text no window starts with
        body = pool[:-n]
    built: list[Prompt] = []
    drawn: list[int] = []
    measured: list[int] = []
    seen: set[str] = set()
    start = 0
    for i in range(count):
        src = source[i % len(source)]
        max_tokens = int(outputs[i]) if outputs is not None else None
        if inputs is None:
            messages = [*prefix, *src.messages]
            built.append(Prompt(src.id, messages, src.followups, max_tokens))
            continue
        n = int(inputs[i])
        if n > len(body):
            raise PromptError(
                f"a drawn input of {n} {counted_in} is longer than the prompt set's text ({len(body)} {counted_in}): lower lengths.input.max"
            )
        text, got, start = _window(tok, body, start, n, seen)
        drawn.append(n)
        measured.append(got)
        built.append(
            Prompt(
                f"len-{i:06d}-{src.id}"[:96], [*prefix, {"role": "user", "content": text}], src.followups, max_tokens
            )
        )
    return Built(
        built,
        counted_in,
        drawn,
        measured,
        [int(x) for x in outputs] if outputs is not None else [],
        lengths.shared_prefix_tokens,
    )


def _pool(source: Sequence[Prompt], tok: Tokenizer, need: int) -> list[int]:
    """The set's text in tokens, prompt after prompt (all of it when it is short), tokenized one prompt at a time."""
    pool: list[int] = []
    for p in source:
        for m in p.messages:
            pool.extend(tok.tokenize(m["content"] + "\n\n"))
        if len(pool) >= need:
            break
    if not pool:
        raise PromptError("the prompt set has no text to cut prompts from")
    return pool


def _window(tok: Tokenizer, body: list[int], start: int, n: int, seen: set[str]) -> tuple[str, int, int]:
    """A text of ``n`` tokens cut from ``body`` at ``start`` (wrapped to fit), not built before; its length tokenized
    again; and where the next window starts. Text cut from a token window can tokenize to a few more or fewer tokens
    (merges at its edges, spaces): the window is widened or narrowed until the text's own count is ``n``, or as close
    as four tries get."""
    span = len(body) - n + 1
    for shift in range(span):
        s = (start + shift) % span
        best: tuple[int, str, int] | None = None
        width = n
        for _ in range(4):
            text = tok.detokenize(body[s : s + width])
            got = len(tok.tokenize(text))
            if best is None or abs(got - n) < abs(best[0] - n):
                best = (got, text, width)
            if got == n or s + width + (n - got) > len(body) or width + (n - got) < 1:
                break
            width += n - got
        assert best is not None
        got, text, width = best
        if text not in seen:
            seen.add(text)
            return text, got, s + width
    raise PromptError(
        f"every window of {n} tokens of the prompt set's text is used: lower the prompt count or the lengths"
    )


def cache_path(run_dir: Path, which: str, model: str | None, lengths: Any, source_ref: str, count: int) -> Path:
    """Where a build is kept in the run folder: one per target model and lengths block (resume and slices reuse it)."""
    key = hashlib.sha256(
        json.dumps([model, lengths.model_dump(), source_ref, count], sort_keys=True).encode()
    ).hexdigest()[:12]
    return run_dir / "prompts" / f"{which}-{key}.jsonl"


def measurement_requests(m: Any) -> int:
    """The requests a configuration's measured phases send (the prompts they take, in order: runner_util.prompt_offset)."""
    if m.arrival is not None:
        from harness.load.schedule import schedule

        return sum(len(schedule(m.arrival, k, r)) for k in m.arrival.keys() for r in range(1, m.repetitions + 1))  # noqa: SIM118  Arrival.keys() is the model's method (its phase keys), not a dict's
    return sum(m.streams) * m.requests_per_stream * m.repetitions


def built_or_cached(
    path: Path, source: Sequence[Prompt], lengths: Any, count: int, tokenizer: Tokenizer | None, say: Any = None
) -> list[Prompt]:
    """The prompts built once per run (kept at ``path``) and read back on later calls: every configuration, slice and
    resume sends the same ones."""
    from harness.prompts import load_prompts, write_prompt_lines

    if path.exists():
        return load_prompts(str(path), path.parent)
    built = build(source, lengths, count, tokenizer)
    write_prompt_lines(path, built.to_lines())
    if say is not None:
        what = f"{count} prompts" + (f", input drawn in {built.counted_in}" if built.input_drawn else "")
        say(
            f"built {what}"
            + (f", {built.prefix_tokens}-{built.counted_in} shared prefix" if built.prefix_tokens else "")
            + f": {path}"
        )
    return built.prompts


def soak_prompts(run_dir: Path, model: str | None, soak: Any, source: Sequence[Prompt], engine: Any) -> list[Prompt]:
    """The soak's prompts at drawn lengths (``soak.lengths``), built with the target's tokenizer on the first slice."""
    from harness.common.errors import ScenarioError

    lengths = soak.lengths
    count = lengths.prompts or SOAK_DEFAULT_PROMPTS
    path = cache_path(run_dir, "soak", model, lengths, soak.prompts or "builtin:soak", count)
    try:
        return built_or_cached(path, source, lengths, count, engine if engine.tokenize_path is not None else None)
    except PromptError as exc:
        raise ScenarioError(f"soak.lengths: {exc}") from None
