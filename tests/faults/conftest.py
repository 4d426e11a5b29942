"""Fixtures of the fault suite: the real llama-server with SmolLM2 (tests/integration/conftest.py)."""

from __future__ import annotations

from tests.integration.conftest import llama_server_bin, smollm2  # noqa: F401  fixtures, used by name
