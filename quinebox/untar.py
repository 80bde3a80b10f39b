"""Unpacking a tar archive nobody vouches for into a directory, the same on every Python quinebox runs on.

Python's own safety net, `extractall(filter="data")`, came in 3.11.4 — Debian 12's
python3 is 3.11.2 — and its checks resolve paths as strings with realpath, which
links and over-long names got past until the June 2025 releases. So quinebox
uses tarfile only to read archives and writes every member itself, as
box/images/layers.py does for image layers: each directory is reached from the
destination's fd one component at a time with O_NOFOLLOW, so nothing is ever
written through a link, whatever the archive planted before.

What is refused, naming the member: an absolute name; a `..` component; a member
beneath a symlink or a file the archive made; a symlink whose target is absolute or
resolves outside the destination (following the archive's own links, as the
kernel would, once every member is known — a later link cannot turn an earlier
one outward); a hard link to anything but a file or link the archive already
holds; device files and FIFOs; more members or bytes than the caller's caps; a
name or link target longer than a path can be (PATH_MAX) or deeper than
MAX_DEPTH, so that each member costs what its name is long, and no more.
What lands is what the `data` filter would give: no owners (the caller's), no
set-uid, set-gid or sticky bit, no write for group or others, files readable
and writable by their owner, directories 0755, mtimes kept. A directory that
was there before (the destination, or one in it) keeps its own mode and mtime:
the archive chooses only for what it makes.

An archive read from a file has every header checked before anything is written,
so a refused one leaves the destination as it was (its headers are read twice,
checked then written, rather than kept: memory is the plan's, ~150 bytes a member). A stream is checked as it is
written; when it is refused, the caller discards what it was unpacked into.
"""

from __future__ import annotations

import errno
import gzip
import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO

#: What a damaged, truncated or mislabelled archive raises while it is read.
_BROKEN = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError, ValueError)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Symlinks followed in one lookup before the kernel says ELOOP.
_MAX_HOPS = 40
#: Path components the link check may walk in all, so that tangled links cannot keep the host busy.
_MAX_STEPS = 4_000_000


class Refused(Exception):
    """An archive (or one of its members) that will not be unpacked; the message names the member and why."""


class TooLarge(Refused):
    """An archive past a cap on its members or its bytes: a limit reached, not an unsafe member."""


class Unreadable(Exception):
    """Not a tar archive, or a damaged one."""


def unpack(source: str | os.PathLike[str] | IO[bytes], into: str | os.PathLike[str], *, max_members: int, max_bytes: int) -> None:
    """Unpack the tar at `source` (a path, or a binary stream; compressed or not) into the directory `into`. Refused and Unreadable say why; nothing is written outside `into`."""
    root = os.open(into, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        writer = _Writer(root)
        if isinstance(source, (str, os.PathLike)):
            with _reading():
                archive = open(source, "rb")  # closed by the with below; read twice
            with archive:
                plan = _Plan(max_members, max_bytes)
                with _reading(), tarfile.open(fileobj=archive, mode="r:*") as tar:
                    for member in _each(tar):
                        plan.add(member)
                plan.finish()
                del plan  # the writing pass checks each member again, against a plan of its own
                archive.seek(0)
                _write(archive, writer, _Plan(max_members, max_bytes), streamed=False)
        else:
            _write(source, writer, _Plan(max_members, max_bytes), streamed=True)
        writer.finish()
    finally:
        os.close(root)


def _write(source: IO[bytes], writer: _Writer, plan: _Plan, *, streamed: bool) -> None:
    """Each member checked (what its header alone says) and written, in the archive's order."""
    with _reading():
        tar = tarfile.open(fileobj=source, mode="r|*") if streamed else tarfile.open(fileobj=source, mode="r:*")
    with _reading(), tar:
        for member in _each(tar):
            writer.put(tar, member, plan.add(member))
    plan.finish()


def _each(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The archive's members, each forgotten by tarfile once read: it keeps every header (~440 bytes each) for
    random access nobody here needs, so a file's memory is the plan's (~150 bytes a member), not the sum of its
    headers. The headers are read twice (checked, then written) instead of kept."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # type: ignore[attr-defined]  # tarfile's own list (since 2.x), not in typeshed
        yield member


class _reading:
    """Errors of reading the archive, as Unreadable."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, _BROKEN):
            raise Unreadable(str(exc) or type(exc).__name__) from None
        if isinstance(exc, OSError):  # a bz2 stream's damage, or the archive's file that cannot be opened
            raise Unreadable(exc.strerror or str(exc)) from None


#: Bytes a name may have: PATH_MAX (4096, linux/limits.h) counts the NUL, so no path call takes a longer one.
MAX_NAME = 4095
#: Components a name may have: no real tree is this deep (PATH_MAX allows ~2048 one-letter ones), and the
#: writer opens a member's directories one by one, so depth is the cost of each member.
MAX_DEPTH = 256


class _Node:
    """One path the archive makes: a directory ("d", with what it holds), a symlink ("l", with its target) or
    anything else ("f"). A tree, not a dict of whole paths, so that a member costs what its name is long: each
    of its components is looked up once, beneath the one before, and no prefix is ever rebuilt. It holds no
    link upward: without cycles, a plan is freed the moment it is dropped."""

    __slots__ = ("kind", "below", "target")

    def __init__(self, kind: str, target: str = ""):
        self.kind, self.target = kind, target
        self.below: dict[str, _Node] | None = {} if kind == "d" else None


class _Plan:
    """What the archive makes, from its headers alone: each member checked against what came before it."""

    def __init__(self, max_members: int, max_bytes: int):
        self.max_members, self.max_bytes = max_members, max_bytes
        self.members = self.bytes = 0
        self.root = _Node("d")
        #: Each symlink made, with its name's components (one a later member replaced is skipped in `finish`).
        self.links: list[tuple[list[str], _Node]] = []
        self.steps = 0

    def add(self, member: tarfile.TarInfo) -> list[str]:
        """Check `member` against what came before it and record it; its name's components."""
        self.members += 1
        self.bytes += max(member.size, 0)
        if self.members > self.max_members:
            raise TooLarge(f"more than {self.max_members} members")
        if self.bytes > self.max_bytes:
            raise TooLarge(f"more than {self.max_bytes} bytes")
        name = member.name
        parts = self._parts(name)
        if member.ischr() or member.isblk() or member.isfifo():
            raise Refused(f"{name} is a device file or FIFO")
        if not parts:
            if not member.isdir():
                raise Refused(f"{name!r} names the destination itself, and is not a directory")
            return parts
        parent = self.root
        for depth, part in enumerate(parts[:-1], 1):
            assert parent.below is not None
            node = parent.below.get(part)
            if node is None:  # a directory the writer makes on the way
                node = parent.below[part] = _Node("d")
            elif node.kind != "d":
                above = "/".join(parts[:depth])
                raise Refused(f"{name!r} goes through {above!r}, which is a symlink or a file in the archive")
            parent = node
        assert parent.below is not None
        base = parts[-1]
        was = parent.below.get(base)
        if was is not None and (was.kind == "d") != member.isdir():
            raise Refused(f"{name!r} is in the archive both as a directory and as something else")
        if member.isdir():
            if was is None:
                parent.below[base] = _Node("d")
        elif member.issym():
            parent.below[base] = node = _Node("l", self._link_target(member))
            self.links.append((parts, node))
        elif member.islnk():
            source = self._find(self._link_parts(member))
            if source is None or source.kind == "d":
                what = "a directory" if source else "nothing the archive holds before it"
                raise Refused(f"hard link {name!r} names {member.linkname!r}, which is {what}")
            parent.below[base] = node = _Node(source.kind, source.target)
            if node.kind == "l":  # a second name of a symlink: its target is read from the new place
                self.links.append((parts, node))
        else:
            parent.below[base] = _Node("f")
        return parts

    def finish(self) -> None:
        """Every symlink the archive made, resolved as the kernel would once all are in place, stays inside."""
        for parts, link in self.links:
            here: list[_Node | None] = [self.root]
            for part in parts[:-1]:  # directories all, as `add` made sure
                below = here[-1].below if here[-1] is not None else None
                here.append(below.get(part) if below is not None else None)
            below = here[-1].below if here[-1] is not None else None
            if below is None or below.get(parts[-1]) is not link:
                continue  # a later member of its name took its place
            if not self._inside(here, link.target):
                path = "/".join(parts)
                raise Refused(f"{path!r} would link to {link.target!r}, which is outside the destination")

    def _inside(self, here: list[_Node | None], target: str) -> bool:
        """Whether `target`, read in the directory `here` (the nodes from the destination down, None for one the
        archive does not make), resolves inside: each step costs one component's lookup."""
        pending = list(reversed(target.split("/")))
        hops = 0
        while pending:
            self.steps += 1
            if self.steps > _MAX_STEPS:
                raise Refused(f"its symlinks are too tangled to check (past {_MAX_STEPS} steps)")
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if len(here) == 1:
                    return False
                here.pop()
                continue
            top = here[-1]
            node = top.below.get(part) if top is not None and top.below is not None else None
            if node is not None and node.kind == "l":
                hops += 1
                if hops > _MAX_HOPS:
                    return True  # ELOOP: it resolves nowhere, so nowhere outside
                pending.extend(reversed(node.target.split("/")))
                continue
            here.append(node)
        return True

    def _find(self, parts: list[str]) -> _Node | None:
        node: _Node | None = self.root
        for part in parts:
            if node is None or node.below is None:
                return None
            node = node.below.get(part)
        return node

    @staticmethod
    def _parts(name: str) -> list[str]:
        if name.startswith("/"):
            raise Refused(f"{name} is an absolute name")
        _bounded(name, name, "its name")
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if len(parts) > MAX_DEPTH:
            raise Refused(f"{_short(name)} is {len(parts)} directories deep, more than {MAX_DEPTH} (no real tree is)")
        if ".." in parts:
            raise Refused(f"{name!r} would be extracted outside the destination (it names '..')")
        return parts

    @staticmethod
    def _link_target(member: tarfile.TarInfo) -> str:
        target = member.linkname
        if target.startswith("/"):
            raise Refused(f"{member.name!r} is a link to an absolute path ({target})")
        if not target or "\0" in target:
            raise Refused(f"{member.name!r} is a symlink with no usable target")
        _bounded(member.name, target, "its link target")
        return target

    @staticmethod
    def _link_parts(member: tarfile.TarInfo) -> list[str]:
        target = member.linkname
        if target.startswith("/"):
            raise Refused(f"{member.name!r} is a link to an absolute path ({target})")
        _bounded(member.name, target, "its link target")
        parts = [part for part in target.split("/") if part not in ("", ".")]
        if ".." in parts or not parts:
            raise Refused(f"{member.name!r} would link to {target!r}, which is outside the destination")
        return parts


def _bounded(name: str, text: str, what: str) -> None:
    """`text` (the member's name or its link's target) is no longer than a path the kernel takes: checked
    before the name is split or looked at, so that a name of megabytes costs no more than reading it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME:
        raise Refused(f"{_short(name)} is refused: {what} has {size} bytes, more than a path can have ({MAX_NAME}, PATH_MAX)")


def _short(name: str) -> str:
    """A name for a message: a long one cut, so that one line says what is wrong."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"


class _Writer:
    """Members made beneath the destination's fd, never through a link."""

    def __init__(self, root: int):
        self.root = root
        #: Directories' mtimes, set last (deepest first): writing into a directory changes its own.
        self.mtimes: dict[str, float] = {}

    def put(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        if not parts:  # the destination itself, there before: its mode and mtime stay the caller's
            return
        try:
            parent = self._open_dir(parts[:-1], member.name)
            try:
                self._make(parent, parts, member, tar)
            finally:
                os.close(parent)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in a name a pax header gave
            raise Refused(f"cannot unpack {member.name!r}: {getattr(exc, 'strerror', None) or exc}") from None

    def finish(self) -> None:
        for path in sorted(self.mtimes, key=lambda p: p.count("/") + bool(p), reverse=True):
            try:
                fd = self._open_dir(path.split("/") if path else [], path, create=False)
            except (OSError, Refused):
                continue
            try:
                os.utime(fd, (self.mtimes[path], self.mtimes[path]))
            finally:
                os.close(fd)

    def _make(self, parent: int, parts: list[str], member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        base = parts[-1]
        if member.isdir():
            try:
                os.mkdir(base, 0o755, dir_fd=parent)
            except FileExistsError:  # one already there (the caller's, or an earlier member's) is left as it is
                if not stat.S_ISDIR(os.lstat(base, dir_fd=parent).st_mode):
                    raise
                return
            os.chmod(base, 0o755, dir_fd=parent, follow_symlinks=False)
            self.mtimes["/".join(parts)] = member.mtime
            return
        try:
            os.unlink(base, dir_fd=parent)  # a later member of the same name wins; a directory stays (EISDIR)
        except FileNotFoundError:
            pass
        if member.issym():
            os.symlink(member.linkname, base, dir_fd=parent)
            os.utime(base, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            target = [p for p in member.linkname.split("/") if p not in ("", ".")]
            source = self._open_dir(target[:-1], member.linkname, create=False)
            try:
                os.link(target[-1], base, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(source)
        else:
            self._file(parent, base, member, tar)

    @staticmethod
    def _file(parent: int, base: str, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o011
        fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            with _reading():
                source = tar.extractfile(member)
            while source is not None:
                with _reading():
                    chunk = source.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
            out.flush()
            os.fchmod(fd, mode | 0o600)
            os.utime(fd, (member.mtime, member.mtime))

    def _open_dir(self, parts: list[str], name: str, *, create: bool = True) -> int:
        fd = os.dup(self.root)
        try:
            for end, part in enumerate(parts, 1):
                try:
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    where = "/".join(parts[:end])
                    raise Refused(f"{name!r} goes through {where!r}, which is a symlink or a file") from None
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd
