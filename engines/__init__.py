"""Engine adapters, one file each. ``ENGINES`` maps a scenario's ``server.engine`` to its class."""

from __future__ import annotations

from engines.base import Engine
from engines.llamacpp import LlamaCpp

ENGINES: dict[str, type[Engine]] = {LlamaCpp.name: LlamaCpp}


def engine_class(name: str) -> type[Engine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine '{name}'; known: {', '.join(sorted(ENGINES))}") from None
