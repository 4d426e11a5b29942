"""JSON from files and streams the harness did not write itself, without deep recursion.

``json.loads`` recurses once per nesting level. On text nested thousands deep it raises RecursionError,
and a finaliser that the garbage collector runs while the stack is that deep fails too, as an
"unraisable" exception no ``except`` can catch (tests/fuzz/corpus: run_capacity/deeply_nested.json). So
the depth is checked first, iteratively, and text nested deeper than any record of ours is refused as
a ValueError like any other malformed JSON.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 100  # the deepest record the harness writes nests under 10 levels


class NestedTooDeep(ValueError):
    """JSON text nested deeper than MAX_DEPTH."""


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays or objects inside each other (strings skipped)."""
    return deep_at(text, limit) is not None


def deep_at(text: str, limit: int = MAX_DEPTH) -> int | None:
    """The index in ``text`` where nesting first goes past ``limit`` levels, or None."""
    if text.count("[") + text.count("{") <= limit:  # no scan for ordinary records
        return None
    depth = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return i
        elif ch in "]}":
            depth -= 1
    return None


def loads(text: str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` that refuses text nested deeper than ``limit`` with NestedTooDeep (a ValueError)."""
    if too_deep(text, limit):
        raise NestedTooDeep(f"nested more than {limit} levels deep")
    return json.loads(text)
