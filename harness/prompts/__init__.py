"""Prompt sets: built-in ones shipped with the package, or the user's own JSON/JSONL file.

A file holds one prompt per line (JSONL) or a JSON list. Each prompt is either
``{"id": ..., "messages": [{"role": "user", "content": ...}, ...]}`` (OpenAI style), or a
ShareGPT-style ``{"id": ..., "conversations": [{"from": "human", "value": ...}, ...]}``
(the last assistant turn, if any, is dropped: the engine writes it). An optional ``followups``
list holds later user turns: the soak sends them one by one, each with the conversation so far,
so the context grows turn after turn (acceptance is then binned by context depth).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

BUILTIN_PREFIX = "builtin:"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class PromptError(Exception):
    pass


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]
    followups: tuple[str, ...] = ()  # later user turns of a conversation whose context grows

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "followups": list(self.followups)}


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".jsonl") for p in resources.files(__package__).iterdir() if p.name.endswith(".jsonl"))


def load_prompts(ref: str, base_dir: Path) -> list[Prompt]:
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        if name not in builtin_names():
            raise PromptError(f"no built-in prompt set '{name}'; built-in sets: {', '.join(builtin_names())}")
        text = resources.files(__package__).joinpath(f"{name}.jsonl").read_text(encoding="utf-8")
        return _parse(text, f"{ref}")
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror}") from None
    return _parse(text, str(path))


def _parse(text: str, where: str) -> list[Prompt]:
    stripped = text.lstrip()
    items: list[tuple[int, Any]]
    if stripped.startswith("["):
        try:
            items = list(enumerate(json.loads(text), start=1))
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    else:
        items = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    items.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise PromptError(f"{where}:{n}: not valid JSON: {exc.msg}") from None
    prompts = [_one(obj, where, n) for n, obj in items]
    if not prompts:
        raise PromptError(f"{where}: no prompts")
    return prompts


def _one(obj: Any, where: str, n: int) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}:{n}: a prompt is an object with 'messages' or 'conversations'")
    pid = str(obj.get("id", n))
    if "messages" in obj:
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in obj["messages"]]
    elif "conversations" in obj:
        msgs = [{"role": _ROLES.get(str(m.get("from")), "user"), "content": str(m.get("value", ""))} for m in obj["conversations"]]
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
    else:
        raise PromptError(f"{where}:{n}: a prompt needs 'messages' or 'conversations'")
    if not msgs:
        raise PromptError(f"{where}:{n}: prompt '{pid}' has no user message")
    followups = obj.get("followups") or ()
    if not isinstance(followups, (list, tuple)) or not all(isinstance(f, str) for f in followups):
        raise PromptError(f"{where}:{n}: 'followups' is a list of user messages")
    return Prompt(id=pid, messages=msgs, followups=tuple(followups))
