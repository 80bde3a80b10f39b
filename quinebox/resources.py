"""Where the files that ship beside the code are: the Dockerfile and sandbox/.

In a source checkout they sit at the repository root; an installed wheel
carries them under quinebox/_data (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_path(*parts: str) -> Path:
    packaged = _PACKAGE / "_data" / Path(*parts)
    if packaged.exists():
        return packaged
    return _PACKAGE.parent / Path(*parts)


def guest_dir() -> Path:
    return _PACKAGE / "guest"
