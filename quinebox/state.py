"""The state dir: what outlives one quinebox process, where each part of it lives, and how it is kept the user's alone.

    $QUINEBOX_STATE_DIR (default $XDG_STATE_HOME/quinebox, ~/.local/state/quinebox)
      sessions.db                SQLite index: one row per session (agent/store.py)
      sessions/<id>/tape.jsonl   append-only record of a session (agent/store.py)
      sessions/<id>/world/       the session's world and its revisions (worlds/)
      objects/                   file contents of every revision, by SHA-256 (worlds/revisions.py); its
                                 sweep.lock and the open worlds' leases/ keep `prune` off what is in use
                                 (worlds/sweep.py)
      prune.lock                 held by the one `quinebox prune` running (tree/prune.py)
      run/<id>.sock              each live box's socket (box/net/broker.py)
      run/serve.2.sock           the command server's socket (cli/server.py; named for its wire, fdpass.py); run/serve.started while a
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

It is never grantable to a box. It is trusted only as ssh's StrictModes trusts ~/.ssh: the state dir and run/
must be the caller's and writable by no one else, and a file quinebox writes there is opened never through a
link (`open_private`); anything else is refused in one line, naming the path and the fix. Every layer finds its
part here, and weighs it with `tree_bytes`, so this module imports nothing of quinebox but its errors (and
those only to refuse).

What a session writes is the user's alone: its directories 0700, its files 0600 (0400 once sealed), whatever the umask.

A mode given to mkdir or open is masked by the caller's umask: under 000 a tape
made 0644, or a dir made with Python's default, is readable by every local user
wherever home directories can be traversed (missions, the model's answers, whole
worlds), and under 0277 a dir comes out that its owner cannot write. So what is
made here gets its mode set once made — fchmod on the fd of a file, chmod on a
dir — and never by the umask. A file is made under a name of its own and linked
to its name once its mode is set, and one that was there already keeps the mode
it has: a writer never undoes another's seal (an audit segment stays 0400).

The tapes, the index, worlds and their objects, the audit log, approvals and run
records all go through here (agent/, worlds/, audit/, tree/): `private_dir`, `private_file`, `private_write`.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing itself is not imported: the thin client imports this module on its fast path
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


#: The command server's socket, named for the wire it speaks (fdpass.py): a server of an older quinebox, still up
#: after an upgrade until it idles out, listens on a name of its own, which no newer client asks.
SERVE_SOCKET = "serve.2.sock"

#: The directories found to be this user's (`_own`), by path: a command asks for the state dir a score of times,
#: and a command server for every command; each path is looked at once per process.
_trusted: set[str] = set()


def state_root() -> str:
    """The state dir's path, by os.path alone (the thin client finds the server's socket without importing pathlib),
    made if missing (0700) and checked as ssh's StrictModes checks ~/.ssh: a directory of this user's that no one
    else may write. Another user's, or one others may write, is refused in one line (StateError), as is a relative
    QUINEBOX_STATE_DIR (it would be a different dir in every cwd)."""
    override = os.environ.get("QUINEBOX_STATE_DIR")
    if override:
        root = os.path.expanduser(override)
        if not os.path.isabs(root):
            raise _refusal(f"QUINEBOX_STATE_DIR={override!r} is a relative path (a different state dir in each working directory): set it to an absolute one")
    else:
        base = os.environ.get("XDG_STATE_HOME", "")
        if not os.path.isabs(base):  # unset, or relative, which the XDG base directory spec says to ignore
            base = os.path.expanduser("~/.local/state")
        root = os.path.join(base, "quinebox")
    if root not in _trusted:
        _own(root, "state dir", follow=True)
    return root


#: The state dir as a Path, by its path: a command asks for it a score of times (QUINEBOX_STATE_DIR is read each time).
_as_paths: dict[str, Path] = {}


def state_dir() -> Path:
    root = state_root()
    path = _as_paths.get(root)
    if path is None:
        from pathlib import Path

        path = _as_paths[root] = Path(root)
    return path


def run_path() -> str:
    """run/, made if missing and checked as the state dir is: per-box sockets and the servers' (a box reaches its own
    socket by bind mount only)."""
    path = os.path.join(state_root(), "run")
    if path not in _trusted:
        _own(path, "run dir")
    return path


def run_dir() -> Path:
    """run_path() as a Path."""
    run_path()
    return state_dir() / "run"


def serve_socket() -> str:
    """Where `quinebox serve` listens for this user's thin clients (cli/server.py, client.py). run/ is checked when it
    is there; a client that finds none finds no server either, and makes none."""
    run = os.path.join(state_root(), "run")
    if run not in _trusted and os.path.lexists(run):
        _own(run, "run dir", make=False)
    return os.path.join(run, SERVE_SOCKET)


def pool_socket() -> Path:
    """Where the command server's pool of warm boxes is claimed from (box/pool/warm.py, box/pool/claim.py)."""
    return run_dir() / "pool.sock"


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
        return (
            f"{said}{f' ({where})' if where else ''}; it must be yours (uid {os.getuid()}) and writable by you: "
            "fix its owner or mode, or set QUINEBOX_STATE_DIR to a dir of your own"
        )
    return said


def open_private(path: str, flags: int) -> int:
    """`os.open(path, flags)` for a file quinebox writes in the state dir (O_CREAT makes it 0600), never through a
    symbolic link, and only if what opens is a regular file of this user's that no one else may write: a link or a
    file planted there (by whoever once could) is refused in one line, StateError, its target untouched. Give
    O_EXCL where a planted file could be reused, O_APPEND where it is added to (O_TRUNC would truncate a planted
    hard link before the check)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)  # a planted FIFO would block an open
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(f"{path} in the state dir is a symbolic link, which quinebox never writes through: remove it") from None
        raise
    try:
        _check(path, os.fstat(fd), "file", stat.S_ISREG)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _own(path: str, what: str, *, follow: bool = False, make: bool = True) -> None:
    """Make `path` a directory (0700, whatever the umask) if it is missing and `make`, then refuse it (StateError)
    unless it is this user's and no one else may write it; remember it as trusted. `follow`: `path` may be a
    symbolic link to the directory (a state dir kept elsewhere), which is then what is checked."""
    look = os.stat if follow else os.lstat
    try:
        info = look(path)
    except (FileNotFoundError, NotADirectoryError):
        if not make:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # the umask took from the mode; made here, so ours to set
        except FileExistsError:
            pass  # made meanwhile, by whoever: looked at below as any other
        except OSError:
            return  # one that cannot be made: the write that needs it says why (`unwritable`)
        try:
            info = look(path)
        except (FileNotFoundError, NotADirectoryError):
            return
    _check(path, info, what, stat.S_ISDIR)
    if info.st_mode & 0o077:  # ours, and no one else may write it: made by an older quinebox (0755), now ours alone to read
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass
    _trusted.add(path)


def _check(path: str, info: os.stat_result, what: str, kind: Callable[[int], bool]) -> None:
    """StateError in one line, naming `path` and the fix, unless `info` is of `kind`, this user's, and writable by them alone."""
    me = os.geteuid()
    if not kind(info.st_mode):
        raise _refusal(f"the {what} {path} is not a {'directory' if kind is stat.S_ISDIR else 'regular file'}: remove it, or set QUINEBOX_STATE_DIR to a dir of your own")
    if info.st_uid != me:
        raise _refusal(f"the {what} {path} is uid {info.st_uid}'s, not yours (uid {me}): set QUINEBOX_STATE_DIR to a dir of your own (or `chown {me} {path}` if it is yours)")
    if info.st_mode & 0o022:
        raise _refusal(f"the {what} {path} may be written by others (mode {stat.S_IMODE(info.st_mode):04o}): `chmod go-w {path}`")


def _refusal(said: str) -> Exception:
    from quinebox.errors import StateError  # only when refusing: the thin client's start-up does not import it

    return StateError(said)


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


# -- what is written here is the user's alone ------------------------------------------------

DIR_MODE = 0o700
FILE_MODE = 0o600
#: A file that is written once and never again: an object of the store, an audit segment.
SEALED_MODE = 0o400


def private_dir(path: str | os.PathLike[str]) -> None:
    """`path` and each parent of it that is missing, made 0700 (the mode the XDG base directory spec asks of a dir
    an application makes); one already there is left as it is."""
    missing: list[str] = []
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        missing.append(here)
        here = os.path.dirname(here)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # made meanwhile by another writer, who sets its mode
        os.chmod(directory, DIR_MODE)


def private_file(path: str | os.PathLike[str], flags: int) -> int:
    """`os.open(path, flags)`, close-on-exec; a file it makes (O_CREAT; with O_EXCL only one it makes) is made 0600
    beside its name, then linked to it: it is never seen by its name with any other mode, so no one changes the
    mode of a file another may already be using (an audit log that a writer meanwhile sealed: audit/log.py)."""
    flags |= os.O_CLOEXEC
    if not flags & os.O_EXCL:
        try:
            return os.open(path, flags & ~os.O_CREAT)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
    partial = _beside(path)
    fd = _made(partial, flags)
    try:
        os.link(partial, path)
    except FileExistsError:
        os.close(fd)
        if flags & os.O_EXCL:
            raise
        return os.open(path, flags & ~os.O_CREAT)  # made meanwhile by another writer
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(partial)
    return fd


def private_write(path: str | os.PathLike[str], data: bytes) -> None:
    """`path` holding `data`, whole or not at all (written beside it, then renamed over it), 0600; its dir must be there."""
    partial = _beside(path)
    try:
        fd = _made(partial, os.O_WRONLY | os.O_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        raise


def _beside(path: str | os.PathLike[str]) -> str:
    """A name of this process's own in `path`'s dir, for a file that takes `path`'s place once it is ready."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(head, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.new")


def _made(path: str, flags: int) -> int:
    """A new file at `path`, opened with `flags`, 0600 whatever the umask."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
