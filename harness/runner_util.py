"""Small helpers shared by the runner, the soak and the load processes."""

from __future__ import annotations

import random
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port on loopback that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
