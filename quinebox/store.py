"""The state dir: where quinebox keeps what outlives one process.

`QUINEBOX_STATE_DIR` overrides `$XDG_STATE_HOME/quinebox` (default
~/.local/state/quinebox). It is never grantable to a box.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    override = os.environ.get("QUINEBOX_STATE_DIR")
    if override:
        return Path(override).expanduser().absolute()
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "quinebox"


def run_dir() -> Path:
    """Per-box sockets. Private to the user: a box reaches its own socket by bind mount only."""
    path = state_dir() / "run"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
