"""Deeply nested JSON is refused before the decoder recurses (harness/common/jsonsafe.py)."""

from __future__ import annotations

import json

import pytest

from harness.common import jsonsafe


def test_ordinary_records_parse_and_deep_ones_are_refused_without_recursion() -> None:
    assert jsonsafe.loads('{"a": [1, {"b": [2]}]}') == {"a": [1, {"b": [2]}]}
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(jsonsafe.NestedTooDeep):
        jsonsafe.loads(deep)
    assert isinstance(jsonsafe.NestedTooDeep("x"), ValueError)  # callers catch it as malformed JSON


def test_depth_counts_structure_not_brackets_inside_strings() -> None:
    many_in_strings = json.dumps({"s": "[" * 500 + "{" * 500})
    assert not jsonsafe.too_deep(many_in_strings)
    assert jsonsafe.loads(many_in_strings)["s"].startswith("[[[")
    escaped = json.dumps({"s": '\\"' + "[" * 300})
    assert not jsonsafe.too_deep(escaped)
    wide = json.dumps([[i] for i in range(1000)])  # 1001 brackets, depth 2
    assert not jsonsafe.too_deep(wide)
    at_limit = "[" * jsonsafe.MAX_DEPTH + "]" * jsonsafe.MAX_DEPTH
    assert not jsonsafe.too_deep(at_limit) and jsonsafe.too_deep("[" + at_limit + "]")
    assert jsonsafe.deep_at('{"a": ' + "[" * 101, 100) == 6 + 99  # the object is level 1: the 100th "[" is level 101
