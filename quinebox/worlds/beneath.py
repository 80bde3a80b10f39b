"""Filesystem access that never leaves a root directory.

A world is written by an untrusted box, possibly while the host reads it: any
path component may be swapped for a symlink between two system calls. So the
host never resolves a world path as a string; it walks from a directory file
descriptor one component at a time with O_NOFOLLOW, and a symlink anywhere
but the last component is an error, not a detour.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: O_NONBLOCK: a file swapped for a FIFO after we looked must not hang the host.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Escape(OSError):
    """A world path that names something outside the world, or walks through a symlink."""


def parts(rel: str) -> list[str]:
    """The components of a world-relative path; refuses absolute, `..`, and empty names."""
    if not rel or rel.startswith("/") or "\0" in rel:
        raise Escape(f"bad world path {rel!r}: it must be relative")
    names = [p for p in rel.split("/") if p not in ("", ".")]
    if any(name == ".." for name in names) or not names:
        raise Escape(f"bad world path {rel!r}: no '..' and no empty names")
    return names


def open_dir(root_fd: int, names: list[str], *, create: bool = False, mode: int = 0o755) -> int:
    """An fd for root/names…, each component a real directory (made when `create`)."""
    fd = os.dup(root_fd)
    try:
        for name in names:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, mode, dir_fd=fd)
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Escape(f"{'/'.join(names)}: {name} is not a directory (a symlink is never followed)") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_parent(root_fd: int, rel: str, *, create: bool = False) -> tuple[int, str]:
    """(fd of the directory holding `rel`, its last name)."""
    names = parts(rel)
    return open_dir(root_fd, names[:-1], create=create), names[-1]


def lstat(root_fd: int, rel: str) -> os.stat_result | None:
    try:
        fd, name = open_parent(root_fd, rel)
    except (FileNotFoundError, Escape, NotADirectoryError):
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def open_file(dir_fd: int, name: str) -> int:
    """A regular file in `dir_fd`, opened for reading; OSError if it is anything else now."""
    fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Escape(f"{name} is not a regular file")
    return fd


def remove(dir_fd: int, name: str) -> None:
    """Remove `name` in `dir_fd` whatever it is; a directory with all it holds."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            remove(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def walk(root_fd: int, top: str = "") -> Iterator[tuple[str, int, Iterator[tuple[str, os.DirEntry]]]]:
    """Each directory at or below `top`, depth first, as (its path, an fd for it, its entries as
    (path, DirEntry)). Entries are read as they are consumed, so a huge directory costs no memory;
    the directories among them are visited next, never through a symlink. A directory that is gone
    or unreadable by the time it is reached is skipped."""
    pending = [top]
    while pending:
        rel_dir = pending.pop()
        try:
            fd = open_dir(root_fd, parts(rel_dir)) if rel_dir else os.dup(root_fd)
        except OSError:
            continue
        try:
            with os.scandir(fd) as listing:
                yield rel_dir, fd, _entries(listing, rel_dir, pending)
        finally:
            os.close(fd)


def _entries(listing: Iterator[os.DirEntry], rel_dir: str, pending: list[str]) -> Iterator[tuple[str, os.DirEntry]]:
    """One directory's entries by their path from the top; each directory among them is queued to be walked."""
    for item in listing:
        rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
        if item.is_dir(follow_symlinks=False):
            pending.append(rel)
        yield rel, item
