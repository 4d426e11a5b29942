"""Prompt sets: built-in ones shipped with the package, or the user's own JSON/JSONL file.

A file holds one prompt per line (JSONL) or a JSON list. Each prompt is either
``{"id": ..., "messages": [{"role": "user", "content": ...}, ...]}`` (OpenAI style), or a
ShareGPT-style ``{"id": ..., "conversations": [{"from": "human", "value": ...}, ...]}``
(the last assistant turn, if any, is dropped: the engine writes it). An optional ``followups``
list holds later user turns: the soak sends them one by one, each with the conversation so far,
so the context grows turn after turn (acceptance is then binned by context depth). An optional
``max_tokens`` sets that prompt's answer length (synthetic lengths write it: harness/prompts/lengths.py).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from harness.common import jsonsafe

BUILTIN_PREFIX = "builtin:"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class PromptError(Exception):
    pass


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]
    followups: tuple[str, ...] = ()  # later user turns of a conversation whose context grows
    max_tokens: int | None = None  # this prompt's answer length (synthetic lengths); None: the scenario's max_tokens

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "messages": self.messages, "followups": list(self.followups)}
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prompt:
        return cls(str(d["id"]), d["messages"], tuple(d.get("followups") or ()), d.get("max_tokens"))


_BUILTIN_SUFFIXES = (".jsonl", ".jsonl.gz")


def _builtin_files() -> dict[str, Any]:
    files: dict[str, Any] = {}
    for p in resources.files(__package__).iterdir():
        for suffix in _BUILTIN_SUFFIXES:
            if p.name.endswith(suffix):
                files[p.name.removesuffix(suffix)] = p
    return files


def distinct_prompts(records: Any) -> int:
    """How many different prompts ``records`` sent: (prompt id, turn) pairs, a conversation's turns counted apart."""
    return len(
        {(r.prompt_id, r.turn) if hasattr(r, "prompt_id") else (r.get("prompt_id"), r.get("turn", 0)) for r in records}
    )


def share_index(start: int, seq: int, index: int, total: int, count: int, reuse: str) -> int | None:
    """Which prompt a soak process sends as its ``seq``-th: process ``index`` of ``total`` takes every ``total``-th
    prompt from its own index, past ``start`` (where earlier slices stopped), so no two processes send the same one.
    None when the set is used up and ``reuse`` is 'forbid'; with 'allow' it comes round again."""
    i = start + seq * total + index
    if i >= count and reuse == "forbid":
        return None
    return i % count


def write_prompt_lines(path: Path, lines: list[str]) -> None:
    """A prompt file the run builds (harness/prompts/lengths.py, fit.py), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


def builtin_names() -> list[str]:
    return sorted(_builtin_files())


def builtin_text(name: str) -> str:
    """The JSONL text of built-in set ``name`` (a large one ships gzipped)."""
    path = _builtin_files()[name]
    data = path.read_bytes()
    return (gzip.decompress(data) if path.name.endswith(".gz") else data).decode("utf-8")


def load_prompts(ref: str, base_dir: Path) -> list[Prompt]:
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        if name not in builtin_names():
            raise PromptError(f"no built-in prompt set '{name}'; built-in sets: {', '.join(builtin_names())}")
        return _parse(builtin_text(name), f"{ref}")
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PromptError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None
    return _parse(text, str(path))


def _parse(text: str, where: str) -> list[Prompt]:
    stripped = text.lstrip()
    items: list[tuple[int, Any]]
    if stripped.startswith("["):
        items = _json_list(text, where)
    else:
        items = []
        for n, line in enumerate(text.split("\n"), start=1):  # lines as editors count them: U+2028 is JSON text
            if line.strip():
                try:
                    obj = jsonsafe.loads(line)
                except ValueError as exc:
                    raise _not_json(where, n, exc) from None
                if not (
                    isinstance(obj, dict) and set(obj) == {"_meta"}
                ):  # a line about the file (how it was built), not a prompt
                    items.append((n, obj))
    listed = stripped.startswith("[")
    prompts = [_one(obj, where, n, i if listed else n) for i, (n, obj) in enumerate(items, start=1)]
    if not prompts:
        raise PromptError(f"{where}: no prompts")
    return prompts


_BLANK = re.compile(r"[ \t\n\r]*")


def _json_list(text: str, where: str) -> list[tuple[int, Any]]:
    """The items of a JSON list, each with the line it starts on (errors name the item's line)."""
    decode = json.JSONDecoder().raw_decode
    items: list[tuple[int, Any]] = []
    start = _blank(text, 0)
    if not text.startswith("[", start):  # white space JSON does not allow before it
        raise PromptError(f"{where}:{text.count(chr(10), 0, start) + 1}: not valid JSON: Expecting value")
    deep = jsonsafe.deep_at(text, jsonsafe.MAX_DEPTH + 1)  # the list itself is one level
    if deep is not None:
        raise PromptError(
            f"{where}:{text.count(chr(10), 0, deep) + 1}: not valid JSON: nested more than {jsonsafe.MAX_DEPTH} levels deep"
        )
    pos = _blank(text, start + 1)  # after the "["
    line, counted = 1, 0
    closed = text.startswith("]", pos)
    while not closed:
        line, counted = line + text.count("\n", counted, pos), pos
        try:
            obj, pos = decode(text, pos)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        except ValueError as exc:
            raise _not_json(where, line, exc) from None
        items.append((line, obj))
        pos = _blank(text, pos)
        closed = text.startswith("]", pos)
        if not closed and not text.startswith(",", pos):
            raise PromptError(
                f"{where}:{line + text.count(chr(10), counted, pos)}: not valid JSON: expecting ',' or ']'"
            )
        pos = pos if closed else _blank(text, pos + 1)
    end = _blank(text, pos + 1)
    if end < len(text):
        raise PromptError(
            f"{where}:{line + text.count(chr(10), counted, end)}: not valid JSON: extra data after the list"
        )
    return items


def _blank(text: str, pos: int) -> int:
    return _BLANK.match(text, pos).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None


def _not_json(where: str, n: int, exc: BaseException) -> PromptError:
    why = (
        exc.msg
        if isinstance(exc, json.JSONDecodeError)
        else "nested too deeply"
        if isinstance(exc, (RecursionError, jsonsafe.NestedTooDeep))
        else str(exc)
    )
    return PromptError(f"{where}:{n}: not valid JSON: {why}")


def _turns(obj: dict[str, Any], key: str, where: str, n: int) -> list[dict[str, Any]]:
    turns = obj[key]
    if not isinstance(turns, list) or not all(isinstance(m, dict) for m in turns):
        raise PromptError(f"{where}:{n}: '{key}' is a list of objects")
    return turns


def _one(obj: Any, where: str, n: int, number: int) -> Prompt:
    """The prompt on line ``n``; ``number`` is its id when it has none (its line, or its place in a JSON list)."""
    if not isinstance(obj, dict):
        raise PromptError(f"{where}:{n}: a prompt is an object with 'messages' or 'conversations'")
    pid = str(obj.get("id", number))
    if "messages" in obj:
        turns = _turns(obj, "messages", where, n)
        if not all("role" in m and "content" in m for m in turns):
            raise PromptError(f"{where}:{n}: every message needs 'role' and 'content'")
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in turns]
    elif "conversations" in obj:
        turns = _turns(obj, "conversations", where, n)
        msgs = [{"role": _ROLES.get(str(m.get("from")), "user"), "content": str(m.get("value", ""))} for m in turns]
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
    else:
        raise PromptError(f"{where}:{n}: a prompt needs 'messages' or 'conversations'")
    if not msgs:
        raise PromptError(f"{where}:{n}: prompt '{pid}' has no user message")
    followups = obj.get("followups") or ()
    if not isinstance(followups, (list, tuple)) or not all(isinstance(f, str) for f in followups):
        raise PromptError(f"{where}:{n}: 'followups' is a list of user messages")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 1_048_576
    ):
        raise PromptError(f"{where}:{n}: 'max_tokens' is a whole number from 1 to 1048576")
    return Prompt(id=pid, messages=msgs, followups=tuple(followups), max_tokens=max_tokens)
