"""/metrics text: every engine's normalise_metrics and engines/_common.py Samples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engines._common import Samples
from harness.common.errors import ScrapeError
from tests.fuzz.common import (
    ALL_ENGINES,
    METRICS_LINES,
    METRICS_SEEDS,
    check_metrics,
    fuzz,
    mutated_bytes,
    renumbered_lines,
    text_of,
)

metrics = (
    renumbered_lines(METRICS_LINES).map(text_of) | mutated_bytes(METRICS_SEEDS).map(text_of) | st.text(max_size=500)
)


@fuzz
@given(text=metrics)
def test_any_metrics_text_normalises_or_is_a_scrape_error(text: str) -> None:
    for engine in ALL_ENGINES:
        check_metrics(engine, text)


@fuzz
@given(text=metrics, data=st.data())
def test_samples_read_back(text: str, data: st.DataObject) -> None:
    try:
        s = Samples(text, "fuzz")
    except ScrapeError as exc:
        assert str(exc).startswith("fuzz: /metrics")
        return
    names = sorted(s.totals) or ["none"]
    value = s.get(*data.draw(st.lists(st.sampled_from(names), max_size=3)))
    assert value is None or isinstance(value, float)
    for name, label in sorted(s.by_label)[:20]:
        try:
            assert len(s.per_label(name, label)) <= 1024
        except ScrapeError as exc:  # a label value that is no position: rejected, and named
            assert str(exc).startswith(f"fuzz: /metrics: {name}{{{label}=")
