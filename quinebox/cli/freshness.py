"""Whether a command server still runs the code and the config a fresh `quinebox` would.

A server answers with what it imported when it started. After an upgrade
(`pip install -U`, or an edit to an editable install) or a change to
config.yaml, a fresh process would behave differently, so before each command
the server compares this fingerprint with the one it took when it started.
When the two differ it hands the command back unrun and exits, and the thin
client starts a server with the new code (cli/server.py, client.py). Mercurial's
chg compares its server's config hash and extensions' mtimes the same way.

Stats only: nothing is read, so the check costs about a millisecond. A server watches the directories it
stats (inotify, `Changes`) and stats again only after something happened in one of them: then the check costs
nothing at all for each command. It watches its state dir too (`Gone`): one removed leaves it nothing to serve.
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


class Changes:
    """Whether anything `fingerprint` looks at may have changed since the last look: inotify watches on each
    directory of the package, each of the import path, the interpreter's and config.yaml's (or, while that does not
    exist, its nearest existing ancestor's). Anything at all happening there says so — the fingerprint, not this,
    says whether it matters — and a directory that cannot be watched makes every look say so."""

    def __init__(self, paths: list[str], config: str | None = None):
        from inotify_simple import flags

        from quinebox.worlds.tracker import inotify

        self._inotify = inotify()
        self._blind = False
        mask = flags.CREATE | flags.DELETE | flags.MODIFY | flags.ATTRIB | flags.MOVED_FROM | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF
        for directory in _watched(paths, config or config_path()):
            try:
                self._inotify.add_watch(directory, mask)
            except OSError:
                self._blind = True  # a watch limit, a directory gone: look every time

    def happened(self) -> bool:
        """Whether something happened since the last call (always, where something could not be watched)."""
        return bool(self._inotify.read(timeout=0)) or self._blind

    def close(self) -> None:
        self._inotify.close()


class Gone:
    """Whether a server's state dir is gone — removed (a CI job's `rm -rf` of its temporary state dir, say), moved
    away, or its socket unlinked: then no client can reach the server any more, and it exits instead of waiting out
    its idle time. inotify: IN_DELETE_SELF and IN_MOVE_SELF on the state dir and run/, and IN_DELETE and
    IN_MOVED_FROM in run/, for the socket's own name. The last is what tells an `rm -rf` while boxes run: their
    mounts hold the removed directories' dentries, and the kernel says IN_DELETE_SELF only once the last is let
    go — which, for a warm pool's boxes, is once the server has gone. `fileno` is what the server waits on beside
    its socket; a box ending in run/ wakes it for the one read that says it was not the socket. A directory that
    cannot be watched (a watch limit) is not."""

    def __init__(self, state: str, run: str, socket_name: str):
        from inotify_simple import flags

        from quinebox.worlds.tracker import inotify

        self._inotify = inotify()
        self._name = socket_name
        self._gone = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED
        for path, mask in ((state, flags.DELETE_SELF | flags.MOVE_SELF), (run, flags.DELETE_SELF | flags.MOVE_SELF | flags.DELETE | flags.MOVED_FROM | flags.ONLYDIR)):
            try:
                self._inotify.add_watch(path, mask)
            except OSError:
                pass

    def fileno(self) -> int:
        return self._inotify.fileno()

    def happened(self) -> bool:
        """Whether the state dir, run/ or the socket went since the last call (reads what is there, never waits)."""
        return any(event.mask & self._gone or event.name == self._name for event in self._inotify.read(timeout=0))

    def close(self) -> None:
        self._inotify.close()


def _watched(paths: list[str], config: str) -> list[str]:
    found = []
    for folder, dirs, _ in os.walk(os.path.dirname(os.path.abspath(quinebox.__file__))):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.append(folder)
    found += [entry or "." for entry in paths if os.path.isdir(entry or ".")]
    found.append(os.path.dirname(os.path.realpath(sys.executable)))
    ancestor = os.path.dirname(config)
    while ancestor != os.path.dirname(ancestor) and not os.path.isdir(ancestor):
        ancestor = os.path.dirname(ancestor)
    found.append(ancestor)
    return found
