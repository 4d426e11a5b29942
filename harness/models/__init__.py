"""The model workshop: small GGUF models made here, deterministically, for the CPU scenarios and tests.

No trained drafter for SmolLM2 exists on PyPI, so the drafts (and a tiny target with MTP layers)
are generated from SmolLM2 with the PyPI ``gguf`` package and cached. Scenarios name them as
``workshop:NAME`` (harness/models/ref.py).

- ``smollm2-trunc{N}``: SmolLM2 cut to its first N blocks, a real draft with real (low) acceptance;
- ``smollm2-eagle3``, ``smollm2-dflash``: random EAGLE-3 / DFlash drafts for SmolLM2;
- ``qwen35-tiny-mtp``: a random hybrid qwen35 target with one MTP (NextN) block.
"""

from __future__ import annotations

from harness.models.workshop import (
    CACHE_ENV,
    NAMES,
    UnknownModel,
    WorkshopError,
    cache_dir,
    ensure,
    known_names,
    path_for,
    recipe,
)

__all__ = [
    "CACHE_ENV",
    "NAMES",
    "UnknownModel",
    "WorkshopError",
    "cache_dir",
    "ensure",
    "known_names",
    "path_for",
    "recipe",
]
