"""The order of an interleaved run: which configuration each block measures when, and which prompts each phase takes."""

from __future__ import annotations

import random


def block_order(names: list[str], seed: int, block: int) -> list[str]:
    """The order in which interleaved block ``block`` measures the configurations: a shuffle that depends only
    on the run's seed and the block number (a resumed run measures a cut block in the same order)."""
    order = list(names)
    random.Random(f"{seed}/{block}").shuffle(order)
    return order


def prompt_offset(requests_per_stream: int, streams: list[int], repetitions: int, n: int, rep: int) -> int:
    """Where phase (``n`` streams, repetition ``rep``) starts in the prompt list: the phases, taken stream count by
    stream count and repetition by repetition, each use the next ``n × requests_per_stream`` prompts. The same
    phase gets the same prompts in every configuration and in either design."""
    offset = 0
    for s in streams:
        for r in range(1, repetitions + 1):
            if (s, r) == (n, rep):
                return offset
            offset += s * requests_per_stream
    raise ValueError(f"no phase with {n} streams and repetition {rep}")
