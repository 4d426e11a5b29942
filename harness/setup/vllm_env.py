"""Where vLLM lives (its own virtual environment): engines/vllm_env.py, re-exported for the harness."""

from __future__ import annotations

from engines.vllm_env import DEFAULT_VENV, DISTS, VLLM_PYTHON_ENV, vllm_python, vllm_version

__all__ = ["DEFAULT_VENV", "DISTS", "VLLM_PYTHON_ENV", "vllm_python", "vllm_version"]
