"""What a session writes is the user's alone: its directories 0700, its files 0600 (0400 once sealed), whatever the umask.

A mode given to mkdir or open is masked by the caller's umask: under 000 a tape
made 0644, or a dir made with Python's default, is readable by every local user
wherever home directories can be traversed (missions, the model's answers, whole
worlds), and under 0277 a dir comes out that its owner cannot write. So what is
made here gets its mode set once made — fchmod on the fd of a file, chmod on a
dir — and never by the umask. A file is made under a name of its own and linked
to its name once its mode is set, and one that was there already keeps the mode
it has: a writer never undoes another's seal (an audit segment stays 0400).

The tapes, the index, worlds and their objects, the audit log, approvals and run
records all go through here (agent/, worlds/, audit/, tree/); so this module
imports nothing of quinebox.
"""

from __future__ import annotations

import os

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
