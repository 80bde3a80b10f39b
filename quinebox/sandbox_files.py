"""A Sandbox's files: read, written, listed, removed, and copied in and out as tars and directories; its world's revisions.

The part of `quinebox.Sandbox` (sandbox.py) that reaches paths in its box, each an exec of the guest's files.py
there as the box's user (or the `user=` each takes, as exec does), bounded (box/live/box_files.py): a byte cap,
a deadline, nothing the box planted (a FIFO, a socket, a device, a link out) hanging the host or being followed.
A directory coming out of the box is the box's work, unpacked here as untrusted (untar.py). In an attached box
each counts as the box in use.

    sb.mkdir("/world/src"); sb.put_dir("src", "/world/src")
    [f.name for f in sb.listdir("/world/src")]        # FileInfo(name, path, type, size, mode, mtime) each
    sb.get_dir("/world/out", "out", max_bytes=100 << 20)
"""

from __future__ import annotations

import io
import os
import shlex
import tarfile
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any

from quinebox import untar
from quinebox.box.live import box_files, sandboxes
from quinebox.box.live.box_files import FileInfo
from quinebox.box.live.execs import Target
from quinebox.errors import QuineboxError

if TYPE_CHECKING:
    from quinebox.box.process import BoxProcess


class SandboxWorld:
    """A long-lived box's /world and its revisions: one after each exec that changed it, as an agent's after each sh call."""

    def __init__(self, sandbox: SandboxFiles):
        self._sandbox = sandbox
        self.session = sandbox.id

    def commit(self, note: str = "commit", *, command: str | None = None) -> dict[str, Any] | None:
        """A revision now if the world changed since the newest (its record), else None; `command`: what changed it,
        as `quinebox world log` shows (a caller that runs execs its own way, through Popen, says which)."""
        if self._sandbox._box is None:
            raise QuineboxError(f"box {self.session}'s world is revised by its owner: this Sandbox is attached to it")
        world = self._sandbox._box.world
        if world is None:
            raise QuineboxError(f"box {self.session} has no world of its own to revise (it was made with --world DIR)")
        with self._sandbox._revising:
            return world.revise(note, command=command)

    def log(self) -> list[dict[str, Any]]:
        from quinebox.worlds.revisions import RevisionLog

        return RevisionLog(self.session).records()

    def diff(self, rev: int | None = None, against: int | None = None) -> str:
        """What `quinebox world diff ID [REV] [--against REV]` prints."""
        from quinebox.worlds import history

        out = io.StringIO()
        history.print_diff(self.session, rev, against, out=out)
        return out.getvalue()

    def export(self, out: IO[bytes], rev: int | None = None) -> list[str]:
        """A revision (default: the newest) as a tar archive on `out`; the paths whose bytes were not kept."""
        from quinebox.worlds import history

        return history.export(self.session, rev, out)

class SandboxFiles:
    """The files of a Sandbox's box (which sets these attributes and defines `_ready`)."""

    id: str
    target: Target
    _box: BoxProcess | None
    _revising: threading.Lock

    if TYPE_CHECKING:

        def _ready(self) -> None: ...

        def _exec_target(self) -> Target: ...

        def Popen(self, *args: Any, **kwargs: Any) -> Any: ...

        async def _in_thread(self, call: Any, *args: Any, **kwargs: Any) -> Any: ...

    @property
    def world(self) -> SandboxWorld:
        return SandboxWorld(self)

    def _revise(self, argv: Sequence[str]) -> None:
        """A revision of the world if the exec changed it: what `sb.world.log()` and `quinebox world log` show."""
        if self._box is not None and self._box.world is not None:
            self.world.commit("exec", command=shlex.join(argv))

    def _files(self, call: Callable[..., Any], path: str, *args: Any, user: str | None = None, **options: Any) -> Any:
        """`call(target, path, ...)` as `user` (default the box's; "root" where the box's root is no one outside, as for
        exec), the box running and not paused; in an attached box, counted as in use (a holder's idle limit waits)."""
        self._ready()
        if self._box is not None:  # the owner: through the box's init, the fast way
            return call(self._exec_target(), path, *args, user=sandboxes.user_of(self.target, user), **options)
        with sandboxes.Running(self.id):  # its owner starts them, as it does its own execs (and says who `user` is)
            return call(box_files.Via(self.target, self.Popen), path, *args, user=user, **options)

    def read_file(self, path: str, *, max_bytes: int = box_files.READ_MAX, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> bytes:
        """A file's bytes, as the box's user may read it: FileNotFoundError, IsADirectoryError, PermissionError.

        The box may have made `path` anything, so the read is bounded: a FIFO, a socket or a device is
        shutil.SpecialFileError, a file of more than `max_bytes` (default 256 MiB) FileTooLargeError, a read
        longer than `timeout` seconds TimeoutError — each at once or by its bound, and the box stays up."""
        return self._files(box_files.read_bytes, path, max_bytes=max_bytes, timeout=timeout, user=user)

    def write_file(self, path: str, data: bytes | str, *, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """`data` (str as UTF-8) into a file of the box, its missing parent directories made, replaced whole;
        shutil.SpecialFileError if the box made `path` a FIFO, a socket or a device."""
        self._files(box_files.write_bytes, path, data.encode() if isinstance(data, str) else data, timeout=timeout, user=user)
        self._revise(["write_file", path])

    def listdir(self, path: str = ".", *, max_bytes: int = box_files.READ_MAX, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> list[FileInfo]:
        """What a directory of the box holds, by name (links as links); FileTooLargeError past `max_bytes` of listing."""
        return self._files(box_files.listdir, path, max_bytes=max_bytes, timeout=timeout, user=user)

    def stat(self, path: str, *, follow_symlinks: bool = False, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> FileInfo:
        """What `path` is in the box: a link itself, unless `follow_symlinks`."""
        return self._files(box_files.stat, path, follow_symlinks=follow_symlinks, timeout=timeout, user=user)

    def remove(self, path: str, *, recursive: bool = False, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """Remove a file or link of the box; a directory with everything in it when `recursive` (never through a
        link), else IsADirectoryError. (The box itself ends with `destroy()`.)"""
        self._files(box_files.remove, path, recursive=recursive, timeout=timeout, user=user)
        self._revise(["remove", path])

    def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """Make a directory in the box (with its missing parents); FileExistsError unless `exist_ok`."""
        self._files(box_files.mkdir, path, parents=parents, exist_ok=exist_ok, timeout=timeout, user=user)

    def put_tar(self, path: str, fileobj: IO[bytes], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """Unpack the tar read from `fileobj` into directory `path` of the box (made if missing), as the box's user:
        no member outside `path`, nothing through a link, no device or FIFO, modes as tarfile's `data` filter gives;
        a refused archive is QuineboxError naming the member, and nothing of it is written."""
        self._files(box_files.put_tar, path, fileobj, max_bytes=max_bytes, timeout=timeout, user=user)
        self._revise(["put_tar", path])

    def get_tar(self, path: str, fileobj: IO[bytes], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """A tar of `path` onto `fileobj`: a file as one member of its name, a directory's contents by their paths in
        it; links as links, FIFOs, sockets and devices left out. FileTooLargeError past `max_bytes` (default 1 GiB).
        It is the box's work: unpack it as untrusted (`get_dir` does)."""
        self._files(box_files.get_tar, path, fileobj, max_bytes=max_bytes, timeout=timeout, user=user)

    def put_dir(
        self, local_dir: str | os.PathLike[str], path: str, *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None,
    ) -> None:
        """A directory of this machine's copied into directory `path` of the box (its contents; links as links, an
        absolute or outward one refused; FIFOs, sockets and devices left out); FileTooLargeError past `max_bytes` of
        tar (default 1 GiB)."""
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(20, "Not a directory", str(local_dir))
        read_end, write_end = os.pipe()
        failed: list[BaseException] = []
        thread = threading.Thread(target=_tar_of, args=(os.fspath(local_dir), write_end, failed), daemon=True)
        thread.start()
        try:
            with os.fdopen(read_end, "rb") as stream:
                self.put_tar(path, stream, max_bytes=max_bytes, timeout=timeout, user=user)
        finally:
            thread.join(timeout)
        if failed:
            raise failed[0]

    def get_dir(self, path: str, local_dir: str | os.PathLike[str], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """What `path` of the box holds, into `local_dir` here (made if missing), unpacked as untrusted (untar.py:
        nothing through a link, nothing outside `local_dir`, no device or FIFO; a refused archive is QuineboxError)."""
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix="quinebox-get-", suffix=".tar") as spool:
            self.get_tar(path, spool, max_bytes=max_bytes, timeout=timeout, user=user)
            spool.flush()
            try:
                untar.unpack(spool.name, local_dir, max_members=box_files.MAX_MEMBERS, max_bytes=max_bytes)
            except (untar.Refused, untar.Unreadable) as exc:
                raise QuineboxError(f"refused what box {self.id} gave for {path}: {exc}") from None

    # -- async twins ---------------------------------------------------------------------------

    async def aread_file(self, path: str, **options: Any) -> bytes:
        return await self._in_thread(self.read_file, path, **options)

    async def awrite_file(self, path: str, data: bytes | str, **options: Any) -> None:
        await self._in_thread(self.write_file, path, data, **options)

    async def alistdir(self, path: str = ".", **options: Any) -> list[FileInfo]:
        return await self._in_thread(self.listdir, path, **options)

    async def astat(self, path: str, **options: Any) -> FileInfo:
        return await self._in_thread(self.stat, path, **options)

    async def aremove(self, path: str, **options: Any) -> None:
        await self._in_thread(self.remove, path, **options)

    async def amkdir(self, path: str, **options: Any) -> None:
        await self._in_thread(self.mkdir, path, **options)

    async def aput_tar(self, path: str, fileobj: IO[bytes], **options: Any) -> None:
        await self._in_thread(self.put_tar, path, fileobj, **options)

    async def aget_tar(self, path: str, fileobj: IO[bytes], **options: Any) -> None:
        await self._in_thread(self.get_tar, path, fileobj, **options)

    async def aput_dir(self, local_dir: str | os.PathLike[str], path: str, **options: Any) -> None:
        await self._in_thread(self.put_dir, local_dir, path, **options)

    async def aget_dir(self, path: str, local_dir: str | os.PathLike[str], **options: Any) -> None:
        await self._in_thread(self.get_dir, path, local_dir, **options)


def _tar_of(local_dir: str, fd: int, failed: list[BaseException]) -> None:
    """`local_dir`'s contents as a tar stream on `fd` (links as links; FIFOs, sockets and devices left out)."""
    def kept(item: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return item if item.isreg() or item.isdir() or item.issym() or item.islnk() else None

    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, name), arcname=name, filter=kept)
    except BrokenPipeError:
        pass  # the box stopped reading: what it said is what counts
    except BaseException as exc:  # noqa: BLE001 raised again in the caller's thread
        failed.append(exc)
