"""The state dir: what outlives one quinebox process, and where each part of it lives.

    $QUINEBOX_STATE_DIR (default $XDG_STATE_HOME/quinebox, ~/.local/state/quinebox)
      sessions.db                SQLite index: one row per session (agent/store.py)
      sessions/<id>/tape.jsonl   append-only record of a session (agent/store.py)
      sessions/<id>/world/       the session's world and its revisions (worlds/)
      objects/                   file contents of every revision, by SHA-256 (worlds/revisions.py); its
                                 sweep.lock and the open worlds' leases/ keep `prune` off what is in use
                                 (worlds/sweep.py)
      prune.lock                 held by the one `quinebox prune` running (tree/prune.py)
      run/<id>.sock              each live box's socket (box/net/broker.py)
      run/serve.2.sock           the command server's socket (cli/server.py; named for its wire, wire.py); run/serve.started while a
                                 client's server is starting (client.py)
      serve.log                  what a server started by a client said (client.py)
      run/pool.sock              its pool of warm boxes (box/pool/warm.py); run/claimed/<container>.json
                                 whose session a claimed warm box became (box/pool/claim.py)
      pool/<box>/                a warm box's empty world until it is claimed
      runs/<id>/                 each `map` and `batch` run: its inputs, attempts and end (tree/runs.py)
      engine.log                 what the engine failed to do, for `quinebox doctor` (box/backends/watch.py)
      snapshots/<id>/            a long-lived box's checkpoint: its sealed manifest, runsc's image, its world
                                 (box/live/snapshots.py); snapshots/.keys/<uid> the key each user seals with
      audit/                     the hash-chained audit log and its head; pending requests, decisions and
                                 remembered rules of approvals (audit/)

It is never grantable to a box. Every layer finds its part here, and weighs it with `tree_bytes`, so this
module imports nothing of quinebox.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing itself is not imported: the thin client imports this module on its fast path
if TYPE_CHECKING:
    from pathlib import Path


#: The command server's socket, named for the wire it speaks (wire.py): a server of an older quinebox, still up
#: after an upgrade until it idles out, listens on a name of its own, which no newer client asks.
SERVE_SOCKET = "serve.2.sock"


def state_root() -> str:
    """The state dir's path, by os.path alone: the thin client finds the server's socket without importing pathlib."""
    override = os.environ.get("QUINEBOX_STATE_DIR")
    if override:
        return os.path.join(os.getcwd(), os.path.expanduser(override))
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "quinebox")


#: The state dir as a Path, by its path: a command asks for it a score of times (QUINEBOX_STATE_DIR is read each time).
_as_paths: dict[str, Path] = {}


def state_dir() -> Path:
    root = state_root()
    path = _as_paths.get(root)
    if path is None:
        from pathlib import Path

        path = _as_paths[root] = Path(root)
    return path


def run_dir() -> Path:
    """Per-box sockets. Private to the user: a box reaches its own socket by bind mount only."""
    path = state_dir() / "run"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def serve_socket() -> str:
    """Where `quinebox serve` listens for this user's thin clients (cli/server.py, client.py)."""
    return os.path.join(state_root(), "run", SERVE_SOCKET)


def pool_socket() -> Path:
    """Where the command server's pool of warm boxes is claimed from (box/pool/warm.py, box/pool/claim.py)."""
    return state_dir() / "run" / "pool.sock"


def cluster_dir() -> Path:
    """Cluster runs' staging (on a driver) and attempts' spools (on a node), each under its owner's `PID-START`, so `gc` knows whose."""
    return state_dir() / "cluster"


def pool_dir() -> Path:
    """Warm boxes' worlds, beside sessions/ (so that a claim moves one into its session by a rename)."""
    return state_dir() / "pool"


def snapshots_dir() -> Path:
    """Checkpoints of long-lived boxes (box/live/snapshots.py), private to the user who made each."""
    return state_dir() / "snapshots"


def session_dir(session: str) -> Path:
    return state_dir() / "sessions" / session


#: SQLite's result codes (sqlite3.Error.sqlite_errorcode, its low byte) for the errnos they stand for: SQLITE_FULL, SQLITE_READONLY.
_SQLITE_ERRNO = {13: errno.ENOSPC, 8: errno.EACCES}


def unwritable(what: str, exc: BaseException) -> str:
    """One line for a write to the state dir that failed, saying what to do about its cause, told by its errno
    (never its text): a full disk wants space, a refused write an owner or mode put right."""
    reason = getattr(exc, "strerror", None) or str(exc)
    cause = getattr(exc, "errno", None) or _SQLITE_ERRNO.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
    said = f"cannot write {what} in the state dir {state_dir()}: {reason}"
    if cause in (errno.ENOSPC, errno.EDQUOT):
        return f"{said}; free some space there (`quinebox gc`, or remove old sessions/) and run again"
    if cause == errno.EROFS:
        return f"{said}; set QUINEBOX_STATE_DIR to a dir on a filesystem mounted read-write"
    if cause in (errno.EACCES, errno.EPERM):
        where = getattr(exc, "filename", None)
        return f"{said}{f' ({where})' if where else ''}; it must be yours (uid {os.getuid()}) and writable by you: fix its owner or mode, or set QUINEBOX_STATE_DIR to a dir of your own"
    return said


def tree_bytes(path: str | Path) -> int:
    """The bytes of every file under `path`, or of `path` if it is not a directory: what `prune` and `gc` say a
    session dir or an unpacked image held. Links are not followed, a file linked more than once under `path`
    counts once (an unpacked image holds such files), and one that is missing or goes meanwhile counts nothing."""
    try:
        own = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(own.st_mode):
        return own.st_size
    total = 0
    linked: set[tuple[int, int]] = set()
    for top, _, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if info.st_nlink > 1:
                if (info.st_dev, info.st_ino) in linked:
                    continue
                linked.add((info.st_dev, info.st_ino))
            total += info.st_size
    return total
