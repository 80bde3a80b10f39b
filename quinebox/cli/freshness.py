"""Whether a command server still runs the code and the config a fresh `quinebox` would.

A server answers with what it imported when it started. After an upgrade
(`pip install -U`, or an edit to an editable install) or a change to
config.yaml, a fresh process would behave differently, so before each command
the server compares this fingerprint with the one it took when it started.
When the two differ it hands the command back unrun and exits, and the thin
client starts a server with the new code (cli/server.py, client.py). Mercurial's
chg compares its server's config hash and extensions' mtimes the same way.

Stats only: nothing is read, so the check costs about a millisecond.
"""

from __future__ import annotations

import hashlib
import os
import sys

import quinebox


def config_path() -> str:
    """The config.yaml this process reads (documents.load_config): the server's own settings (its pool) come from it."""
    return os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "quinebox", "config.yaml")


def fingerprint(package: str | None = None, paths: list[str] | None = None, config: str | None = None) -> str:
    """A digest of what a fresh process would load: each file of the package (path, mtime, size), each directory of
    the import path (an install or an uninstall adds or removes entries there), the interpreter, and config.yaml."""
    digest = hashlib.sha256()
    root = package or os.path.dirname(os.path.abspath(quinebox.__file__))
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            digest.update(_stamp(os.path.join(folder, name)))
    for entry in sys.path if paths is None else paths:
        digest.update(_stamp(entry or "."))
    digest.update(_stamp(os.path.realpath(sys.executable)))
    digest.update(_stamp(config or config_path()))
    return digest.hexdigest()


def _stamp(path: str) -> bytes:
    try:
        found = os.stat(path)
    except OSError:
        return f"{path}\0-\n".encode(errors="surrogateescape")
    return f"{path}\0{found.st_mtime_ns}\0{found.st_size}\n".encode(errors="surrogateescape")
