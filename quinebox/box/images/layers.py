"""Applying an image's layers onto a directory, one tar stream at a time, as an engine would, but safely.

Images are not fully trusted, and a layer is a tar written by whoever built
the image: its members may name `../x` or a path through a symlink an
earlier member planted. So nothing here goes through a path: every member is
created relative to a directory fd reached from the root one component at a
time with O_NOFOLLOW, and a member whose path crosses a symlink, a file or
`..` refuses the whole image (an engine's own layers never hold one).
Leading slashes are dropped, as tar does. Hard links are made between two
such resolved places, so they cannot reach outside the tree; symlinks are
written as they are and never followed here (inside the box they resolve
against its own root). Whatever an upper layer writes first removes what a
lower one had there, so nothing is ever written through an old link.

OCI whiteouts: `.wh.NAME` removes NAME of lower layers, `.wh..wh..opq`
hides everything lower layers put in its directory; what the same layer
holds stays, whatever the order of its members. Numeric owners, modes and
mtimes are kept (owners only when running as root), write for others too
(the runtime gives a tmpfs at /tmp the mode of the image's /tmp, 1777; the
tree sits in a directory only its owner may enter); set-uid and set-gid bits
of files are dropped (no box may gain privileges from its image); device
nodes are skipped (a runtime gives a box its /dev) and extended attributes
are not kept.
Directories' own metadata is set last, deepest first, so that a read-only
directory of the image never stops the next member.

Python's tarfile reads the streams; its extraction (and its filters) are not
used, since layering needs removal and whiteouts it does not do.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import zlib
from typing import IO, Any, cast

from quinebox.errors import ImageError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
#: What a damaged or truncated layer raises while it is read.
_BROKEN = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


def member_parts(name: str, what: str) -> list[str]:
    """A member's path as components below the root; `..` anywhere refuses the image."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"{what} has a member outside its root ({name!r}): refusing the image")
    return parts


class _Hashing(io.RawIOBase):
    """A stream read through, its SHA-256 kept: a layer's diff id is the digest of its uncompressed tar."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        self.digest.update(data)
        buffer[: len(data)] = data
        return len(data)


def uncompressed(stream: IO[bytes], what: str) -> IO[bytes]:
    """The layer's tar, whether it came gzipped or not (a seekable stream is sniffed; others are taken as tar)."""
    if not stream.seekable():
        return stream
    magic = stream.read(4)
    stream.seek(-len(magic), io.SEEK_CUR)
    if magic[:2] == b"\x1f\x8b":
        return cast(IO[bytes], gzip.GzipFile(fileobj=stream, mode="rb"))  # a binary stream, which typeshed types apart
    if magic == b"\x28\xb5\x2f\xfd":
        raise ImageError(f"{what} is compressed with zstd, which quinebox cannot read: recompress the image with gzip (e.g. `skopeo copy --dest-compress-format gzip`)")
    return stream


class Tree:
    """A root filesystem under construction at `root` (which must not exist yet); `close()` finishes it."""

    def __init__(self, root: str, what: str):
        self.what = self.label = what
        self.owners = os.geteuid() == 0
        os.mkdir(root, 0o700)
        self.fd = os.open(root, _DIR_FLAGS)
        #: Each directory's (mode, uid, gid, mtime) to set once everything is in place.
        self.dirs: dict[str, tuple[int, int, int, float | None]] = {"": (0o755, 0, 0, None)}

    def close(self) -> None:
        try:
            for path in sorted(self.dirs, key=lambda p: p.count("/") + bool(p), reverse=True):
                mode, uid, gid, mtime = self.dirs[path]
                fd = self._walk(path.split("/") if path else [], create=False, name=path)
                if fd is None:
                    continue
                try:
                    if self.owners:
                        os.fchown(fd, uid, gid)
                    os.fchmod(fd, mode & 0o7777)
                    if mtime is not None:
                        os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)
        finally:
            os.close(self.fd)

    def layer(self, stream: IO[bytes], *, diff_id: str | None = None, whiteouts: bool = True, number: int = 0) -> None:
        """Apply one layer's tar stream; with `diff_id`, the uncompressed stream's digest must be it."""
        what = self.label = f"{self.what}, layer {number}" if number else self.what
        hashing = _Hashing(uncompressed(stream, what))
        made: set[str] = set()
        try:
            with tarfile.open(fileobj=io.BufferedReader(hashing, 1 << 20), mode="r|") as tar:
                for member in tar:
                    self._member(tar, member, made, whiteouts, what)
            while hashing.read(1 << 20):
                pass
        except _BROKEN as exc:
            raise ImageError(f"{what} is not a readable tar: {exc}") from None
        if diff_id is not None and f"sha256:{hashing.digest.hexdigest()}" != diff_id:
            raise ImageError(f"{what} does not match its digest {diff_id[:19]}…: the image is damaged or was tampered with")

    # -- one member ------------------------------------------------------------------------

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, made: set[str], whiteouts: bool, what: str) -> None:
        parts = member_parts(member.name, what)
        if not parts:
            if member.isdir():
                self.dirs[""] = (member.mode, member.uid, member.gid, member.mtime)
            return
        base, path = parts[-1], "/".join(parts)
        if member.ischr() or member.isblk():
            return
        if whiteouts and base.startswith(WHITEOUT):
            self._whiteout(parts, made)
            return
        for end in range(1, len(parts) + 1):
            made.add("/".join(parts[:end]))
        parent = self._walk(parts[:-1], create=True, name=member.name)
        assert parent is not None
        try:
            self._put(parent, base, path, member, tar)
        except OSError as exc:
            if exc.errno in _FULL:
                raise
            raise ImageError(f"{what}: cannot make {member.name!r} ({exc.strerror}): refusing the image") from None
        finally:
            os.close(parent)

    def _put(self, parent: int, base: str, path: str, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        try:
            existing = os.lstat(base, dir_fd=parent).st_mode
        except FileNotFoundError:
            existing = None
        if member.isdir():
            if existing is None or not stat.S_ISDIR(existing):
                if existing is not None:
                    self._remove(parent, base, path)
                os.mkdir(base, 0o700, dir_fd=parent)
            self.dirs[path] = (member.mode, member.uid, member.gid, member.mtime)
            return
        if existing is not None:
            self._remove(parent, base, path)
        mode = member.mode & 0o1777
        if member.isreg():
            fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
            with os.fdopen(fd, "wb") as out:
                source = tar.extractfile(member)
                assert source is not None
                shutil.copyfileobj(source, out, 1 << 20)
                out.flush()
                if self.owners:
                    os.fchown(fd, member.uid, member.gid)
                os.fchmod(fd, mode)
                os.utime(fd, (member.mtime, member.mtime))
        elif member.issym():
            os.symlink(member.linkname, base, dir_fd=parent)
            if self.owners:
                os.chown(base, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
            os.utime(base, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            target = member_parts(member.linkname, self.label)
            source_dir = self._walk(target[:-1], create=False, name=member.linkname) if target else None
            if source_dir is None:
                raise ImageError(f"{self.label}: hard link {member.name!r} names {member.linkname!r}, which is not in the image: refusing the image")
            try:
                os.link(target[-1], base, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(source_dir)
        elif member.isfifo():
            os.mkfifo(base, 0o600, dir_fd=parent)
            if self.owners:
                os.chown(base, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
            os.chmod(base, mode, dir_fd=parent)

    def _whiteout(self, parts: list[str], made: set[str]) -> None:
        parent = self._walk(parts[:-1], create=False, name="/".join(parts))
        if parent is None:
            return
        try:
            if parts[-1] == OPAQUE:
                self._hide_lower(parent, "/".join(parts[:-1]), made)
            elif not parts[-1].startswith(WHITEOUT + WHITEOUT):  # other .wh..wh.* are aufs' bookkeeping
                name = parts[-1][len(WHITEOUT) :]
                path = "/".join([*parts[:-1], name])
                if name and path not in made:
                    try:
                        self._remove(parent, name, path)
                    except FileNotFoundError:
                        pass
        finally:
            os.close(parent)

    def _hide_lower(self, fd: int, path: str, made: set[str]) -> None:
        """Remove what is under `path` except what this layer made there."""
        for name in os.listdir(fd):
            child = f"{path}/{name}" if path else name
            if child not in made:
                self._remove(fd, name, child)
            elif stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    self._hide_lower(sub, child, made)
                finally:
                    os.close(sub)

    def _remove(self, parent: int, base: str, path: str) -> None:
        if stat.S_ISDIR(os.lstat(base, dir_fd=parent).st_mode):
            shutil.rmtree(base, dir_fd=parent)
            self.dirs = {p: meta for p, meta in self.dirs.items() if p != path and not p.startswith(path + "/")}
        else:
            os.unlink(base, dir_fd=parent)

    def _walk(self, parts: list[str], *, create: bool, name: str) -> int | None:
        """An fd of the directory at `parts`, never through a symlink; None when missing (and not `create`)."""
        fd = os.dup(self.fd)
        try:
            for end, part in enumerate(parts, 1):
                try:
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self.dirs.setdefault("/".join(parts[:end]), (0o755, 0, 0, None))
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in _FULL:
                        raise
                    where = "/".join(parts[:end])
                    raise ImageError(f"{self.label}: {name!r} goes through {where!r}, which is a symlink or a file: refusing the image") from None
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

