"""Engine adapters, one file each. ``ENGINES`` maps a scenario's ``server.engine`` to its class."""

from __future__ import annotations

from engines.base import Engine
from engines.llamacpp import LlamaCpp
from engines.sglang import SGLang
from engines.tgi import Tgi
from engines.trtllm import TrtLlm
from engines.vllm import Vllm

ENGINES: dict[str, type[Engine]] = {cls.name: cls for cls in (LlamaCpp, Vllm, SGLang, TrtLlm, Tgi)}


def engine_class(name: str) -> type[Engine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine '{name}'; known: {', '.join(sorted(ENGINES))}") from None
