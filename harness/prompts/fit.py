"""The measurement's prompts that fit one slot: a prompt whose tokens and answer exceed the engine's context per slot
is refused (``context_overflow``) and would make a phase's figures partly errors, so the measurement takes the next
prompt instead. Only the prompts the measured phases take are checked (``need`` of them kept, in the set's order);
the rest of the set follows unchecked (a ramp's later requests). The kept list is written once per run and target
model, so every configuration, resume and after-soak repetition sends the same prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.prompts import Prompt, load_prompts, write_prompt_lines
from harness.prompts.lengths import Tokenizer

# what a chat template adds around the messages (SmolLM2's default system turn is about 20 tokens; <|im_start|>role
# and <|im_end|> a few per message): counted on top of the contents' own tokens, an allowance from above
TEMPLATE_TOKENS = 48
TEMPLATE_TOKENS_PER_MESSAGE = 8


@dataclass(frozen=True)
class Fitted:
    prompts: list[Prompt]
    left_out: list[tuple[str, int]]  # (prompt id, its counted tokens) of the checked prompts that do not fit
    slot_tokens: int
    kept: int  # the checked prompts that fit (the first of ``prompts``); fewer than asked when the set ran out


def counted_tokens(prompt: Prompt, tokenizer: Tokenizer) -> int:
    """The prompt's tokens as the engine counts them, the chat template's share estimated from above."""
    body = sum(len(tokenizer.tokenize(m.get("content") or "")) for m in prompt.messages)
    return body + TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * len(prompt.messages)


def fit(source: Sequence[Prompt], tokenizer: Tokenizer, slot_tokens: int, max_tokens: int | None, need: int) -> Fitted:
    """The first ``need`` prompts of ``source`` whose counted tokens and answer fit ``slot_tokens``, then the rest of
    ``source`` unchecked. None of them fits: no prompts (the caller sends the set as it is, and the engine's refusals
    say why: a configuration whose slot is too small fails as before)."""
    kept: list[Prompt] = []
    left_out: list[tuple[str, int]] = []
    checked = 0
    for p in source:
        if len(kept) >= need:
            break
        checked += 1
        n = counted_tokens(p, tokenizer)
        if n + (p.max_tokens or max_tokens or 0) <= slot_tokens:
            kept.append(p)
        else:
            left_out.append((p.id, n))
    if not kept:
        return Fitted([], left_out, slot_tokens, 0)
    return Fitted(kept + list(source[checked:]), left_out, slot_tokens, len(kept))


def cache_path(run_dir: Path, model: str | None, source_ref: str, max_tokens: int | None, need: int) -> Path:
    key = hashlib.sha256(json.dumps([model, source_ref, max_tokens, need]).encode()).hexdigest()[:12]
    return run_dir / "prompts" / f"fit-{key}.jsonl"


def write(path: Path, fitted: Fitted) -> None:
    """The kept prompts, after a line that says which were left out and why (the prompt reader skips it)."""
    meta = {
        "_meta": {
            "slot_tokens": fitted.slot_tokens,
            "left_out": [{"id": i, "tokens": n} for i, n in fitted.left_out],
            "template_tokens": [TEMPLATE_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE],
        }
    }
    write_prompt_lines(path, [json.dumps(meta)] + [json.dumps(p.to_dict(), ensure_ascii=False) for p in fitted.prompts])


def read(path: Path) -> list[Prompt]:
    return load_prompts(str(path), path.parent)
