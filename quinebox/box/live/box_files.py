"""A long-lived box's files from the host: each operation an exec of the guest's files.py in the box, as its user.

So the kernel, the box's mounts and its links decide what may be read, written, listed or removed there, as for
any command in it (the files' code is this quinebox's own, sent with the exec, never the image's). Each has a byte
cap and a deadline, held here whatever the guest says: nothing a box plants (a FIFO, a socket, a device, a file
without end, a listing without end) hangs or floods the host. Refusals come back as Python's own errors
(FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError), FileTooLargeError
past a cap, TimeoutError past a deadline, shutil.SpecialFileError for what has no bytes. A tar going into a box
is unpacked there by quinebox's untar.py (sent along, as files.py is); one coming out is the box's work, so
whoever unpacks it here treats it as untrusted (untar.py again).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import IO, Any

from quinebox.box.live.capped import Started, Taken
from quinebox.box.live.execs import BoxExec, Target
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.streams.direct import DEVNULL, PIPE
from quinebox.errors import FileTooLargeError, QuineboxError

#: What a read takes at most unless its caller says otherwise: a box's file is held whole in memory.
READ_MAX = 256 << 20
#: How a Sandbox's caller reads more than that.
RAISE_IT = "give read_file(..., max_bytes=N)"
#: The longest a file's read or write may take unless its caller says otherwise (a stopped reader never ends).
FILE_TIMEOUT = 120.0
#: What is kept of files.py's stderr: its one line of why.
ERR_MAX = 4096
#: What a tar taken out of a box or put into one holds at most unless its caller says otherwise (it is streamed).
TAR_MAX = 1 << 30
#: The longest a tar's copy may take unless its caller says otherwise.
TAR_TIMEOUT = 600.0
#: The most members a directory copied out of a box (get_dir) may have.
MAX_MEMBERS = 1_000_000
#: files.py's exit statuses for a FIFO, a socket or a device, a file over the cap, and an archive refused.
NOT_A_FILE, TOO_LARGE, REFUSED = 7, 8, 10


@dataclass(frozen=True)
class Via:
    """Where files.py runs when this process does not start execs in the box itself: the box (its working
    directory is what a relative path is relative to) and `start`, `Sandbox.Popen`'s signature (an attached
    Sandbox's: the box's owner starts them through the box's init, the fast way)."""

    target: Target
    start: Callable[..., Started]


def _start(where: Target | Via, argv: list[str], **streams: Any) -> Started:
    return where.start(argv, **streams) if isinstance(where, Via) else BoxExec(where, argv, **streams)


@functools.cache
def _files_code() -> str:
    return (resources.files("quinebox.guest") / "files.py").read_text()


def files_command(*args: str) -> list[str]:
    """The guest's files.py with `args`, run by the guest's Python from this quinebox's own copy of it (not the
    image's): its refusals of a FIFO, a device and a file past the cap hold in a box of an image built by an older
    quinebox too."""
    return [*GUEST_PYTHON, "-c", _files_code(), *args]


#: files.py's exit statuses, as the errors a local open() would raise.
FILE_ERRORS: dict[int, tuple[type[OSError], int]] = {
    2: (FileNotFoundError, errno.ENOENT), 3: (IsADirectoryError, errno.EISDIR), 4: (PermissionError, errno.EACCES), 6: (NotADirectoryError, errno.ENOTDIR),
    9: (FileExistsError, errno.EEXIST), 11: (OSError, errno.ENOTEMPTY),
}


def read_bytes(
    where: Target | Via, path: str, *, max_bytes: int = READ_MAX, timeout: float = FILE_TIMEOUT, raise_it: str = RAISE_IT,
    user: str | None = None,
) -> bytes:
    """A file's bytes, read in the box as its user: Python's own errors for what is missing or refused (see read_into)."""
    out: list[bytes] = []
    read_into(where, path, out.append, max_bytes=max_bytes, timeout=timeout, raise_it=raise_it, user=user)
    return b"".join(out)


def read_into(
    where: Target | Via, path: str, sink: Callable[[bytes], None], *, max_bytes: int = READ_MAX, timeout: float = FILE_TIMEOUT,
    raise_it: str = RAISE_IT, user: str | None = None,
) -> None:
    """A file's bytes into `sink` as they come, never more than `max_bytes` of them and never longer than `timeout`.

    What the box planted at `path` cannot hang or flood this process: a FIFO, a socket or a device is
    shutil.SpecialFileError naming which; a file past the cap FileTooLargeError naming the cap and `raise_it`
    (how this caller's cap is raised); a read that outlasts the deadline TimeoutError. The guest refuses the
    first two at once; the host counts and times the bytes itself all the same (the box's own processes may
    write into the exec's stdout, or stop it), killing the exec when either runs out. The box stays up.
    """
    full = _absolute(where, path)
    taken = Taken(sink, max_bytes)
    err = Taken(None, ERR_MAX)
    proc = _start(where, files_command("read", full, str(max_bytes)), stdin=DEVNULL, stdout=taken, stderr=err, user=user)
    taken.watch(proc)
    code = proc.wait_drained(timeout)
    taken.close()
    if code == TOO_LARGE or taken.over:
        said = err.text().split(" ", 1)[0]
        size = int(said) if said.isdigit() and code == TOO_LARGE else None
        raise FileTooLargeError(path, size, max_bytes, raise_it)
    _raise(code, path, err, proc.timed_out, timeout, "reading")


def write_bytes(
    where: Target | Via, path: str, data: bytes, *, timeout: float = FILE_TIMEOUT, user: str | None = None,
) -> None:
    """`data` into a file in the box as its user (its parents made); Python's own errors for what is refused,
    shutil.SpecialFileError for a FIFO, a socket or a device there, TimeoutError past `timeout`."""
    err = Taken(None, ERR_MAX)
    proc = _start(where, files_command("write", _absolute(where, path)), stdin=bytes(data), stdout=DEVNULL, stderr=err, user=user)
    code = proc.wait_drained(timeout)
    _raise(code, path, err, proc.timed_out, timeout, "writing")


def _absolute(where: Target | Via, path: str) -> str:
    """A relative path is the box's working directory's, as a command's would be; as files.py's PATH argument: itself,
    or "hex:" and its bytes when it is no UTF-8 text (a name listdir gave with bytes no text has: surrogateescape),
    which no exec's way carries (the init's line, runc's JSON) but files.py turns back into those very bytes."""
    if not path or "\0" in path:
        raise ValueError(f"bad path {path!r}: give a file's path in the box")
    cwd = where.target.cwd if isinstance(where, Via) else where.cwd
    full = cwd if path in (".", "./") else path if path.startswith("/") else os.path.join(cwd, path)
    try:
        full.encode()
    except UnicodeEncodeError:
        return "hex:" + os.fsencode(full).hex()
    return full


def _raise(code: int, path: str, err: Taken, timed_out: bool, timeout: float, doing: str) -> None:
    if timed_out:
        raise TimeoutError(errno.ETIMEDOUT, f"{doing} {path} in the box took longer than {timeout:g} s and was stopped (the box stays up)")
    if code == 0:
        return
    reason = err.text() or f"exit status {code}"
    if code == NOT_A_FILE:
        raise shutil.SpecialFileError(f"{path} in the box is {reason.rpartition(':')[0] or reason}: only a regular file's bytes are copied")
    if code in FILE_ERRORS:
        error, number = FILE_ERRORS[code]
        raise error(number, reason.rpartition(":")[0] or reason, path)
    raise QuineboxError(f"cannot reach {path} in the box: {reason}")


@dataclass(frozen=True)
class FileInfo:
    """What a path in a box is, as `Sandbox.stat` and `listdir` say it (a link is a link, never followed there).
    `type`: "file", "dir", "symlink" or "other" (a FIFO, a socket, a device); `mode`: the permission bits."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: float


def listdir(where: Target | Via, path: str, *, max_bytes: int = READ_MAX, timeout: float = FILE_TIMEOUT, user: str | None = None) -> list[FileInfo]:
    """The entries of a directory in the box, by name; FileTooLargeError when their listing passes `max_bytes`."""
    said = _said(path, _run(where, path, "list", max_bytes=max_bytes, timeout=timeout, raise_it="give listdir(..., max_bytes=N)", user=user))
    if not isinstance(said, list):
        raise QuineboxError(f"the box gave a malformed listing of {path}: not a list of entries")
    return [_file_info(path, entry) for entry in said]


#: What stat's answer holds at most: a path up to PATH_MAX twice (path and name), each character escaped 6 bytes long, and room.
STAT_MAX = 64 << 10


def stat(where: Target | Via, path: str, *, follow_symlinks: bool = False, timeout: float = FILE_TIMEOUT, user: str | None = None) -> FileInfo:
    """What `path` is in the box (a link itself, unless `follow_symlinks`)."""
    try:
        said = _run(where, path, "stat", "1" if follow_symlinks else "0", max_bytes=STAT_MAX, timeout=timeout, user=user)
    except FileTooLargeError:  # no real path's answer is this long: files.py's output is not its own
        raise QuineboxError(f"the box gave more than {STAT_MAX} bytes for stat of {path}: not what quinebox's files.py says") from None
    return _file_info(path, _said(path, said))


#: FileInfo's fields and the types each may have (JSON's numbers: an mtime may come as an int).
FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "path": (str,), "type": (str,), "size": (int,), "mode": (int,), "mtime": (float, int)}
TYPES = ("file", "dir", "symlink", "other")


def _said(path: str, out: bytes) -> Any:
    """files.py's JSON: anything else (a box process may write into its stdout on rootless runc or gVisor) is refused."""
    try:
        return json.loads(out)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both
        raise QuineboxError(f"the box gave a malformed answer for {path}: not JSON ({exc})") from None


def _file_info(path: str, entry: Any) -> FileInfo:
    """One entry, checked: exactly FileInfo's fields, each of its type (never a bool for a number), a known `type`."""
    if not isinstance(entry, dict) or set(entry) != set(FIELDS):
        raise QuineboxError(f"the box gave a malformed entry for {path}: not an object of {', '.join(FIELDS)}")
    bad = next((key for key, types in FIELDS.items() if isinstance(entry[key], bool) or not isinstance(entry[key], types)), None)
    if bad is None and entry["type"] not in TYPES:
        bad = "type"
    if bad is not None:
        raise QuineboxError(f"the box gave a malformed entry for {path}: its {bad} is {entry[bad]!r:.80}")
    return FileInfo(**entry)


def remove(where: Target | Via, path: str, *, recursive: bool = False, timeout: float = FILE_TIMEOUT, user: str | None = None) -> None:
    """A file or link in the box removed (a directory too, with all it holds, when `recursive`: never through a
    link); a directory without `recursive` is IsADirectoryError."""
    _run(where, path, "remove", "1" if recursive else "0", max_bytes=0, timeout=timeout, user=user)


def mkdir(where: Target | Via, path: str, *, parents: bool = True, exist_ok: bool = True, timeout: float = FILE_TIMEOUT, user: str | None = None) -> None:
    _run(where, path, "mkdir", "1" if parents else "0", "1" if exist_ok else "0", max_bytes=0, timeout=timeout, user=user)


def _run(where: Target | Via, path: str, *args: str, max_bytes: int, timeout: float, raise_it: str = RAISE_IT, user: str | None = None) -> bytes:
    """files.py's `args[0]` on `path` in the box: what it wrote, at most `max_bytes`; its refusal as Python's own error."""
    out = Taken(None, max_bytes)
    err = Taken(None, ERR_MAX)
    proc = _start(where, files_command(args[0], _absolute(where, path), *args[1:]), stdin=DEVNULL, stdout=out, stderr=err, user=user)
    out.watch(proc)
    code = proc.wait_drained(timeout)
    out.close()
    if out.over:
        raise FileTooLargeError(path, None, max_bytes, raise_it)
    _raise(code, path, err, proc.timed_out, timeout, DOING[args[0]])
    return b"".join(out.kept)


#: What each of _run's operations is called in a deadline's error.
DOING = {"list": "listing", "stat": "looking at", "remove": "removing", "mkdir": "making"}


def get_tar(where: Target | Via, path: str, fileobj: IO[bytes], *, max_bytes: int = TAR_MAX, timeout: float = TAR_TIMEOUT, user: str | None = None) -> None:
    """A tar of `path` in the box written to `fileobj` as it comes: a file as one member of its name, a directory's
    contents by their paths in it; links as links, FIFOs, sockets and devices left out. Past `max_bytes`
    FileTooLargeError (what came before it is on `fileobj`); the box's tar is its own work: unpack it as untrusted."""
    failed: list[OSError] = []

    def take(chunk: bytes) -> None:
        if not failed:
            try:
                fileobj.write(chunk)
            except OSError as exc:
                failed.append(exc)

    taken = Taken(take, max_bytes)
    err = Taken(None, ERR_MAX)
    proc = _start(where, files_command("gettar", _absolute(where, path), str(max_bytes)), stdin=DEVNULL, stdout=taken, stderr=err, user=user)
    taken.watch(proc)
    code = proc.wait_drained(timeout)
    taken.close()
    if code == TOO_LARGE or taken.over:
        raise FileTooLargeError(path, None, max_bytes, "give max_bytes=N")
    if failed:
        raise failed[0]
    _raise(code, path, err, proc.timed_out, timeout, "archiving")


def put_tar(where: Target | Via, path: str, fileobj: IO[bytes], *, max_bytes: int = TAR_MAX, timeout: float = TAR_TIMEOUT, user: str | None = None) -> None:
    """The tar read from `fileobj` unpacked into directory `path` in the box (made if missing), by the box's user: every
    header checked before a byte is written, nothing outside `path`, nothing written through a link, no device or
    FIFO, modes as Python's `data` filter gives them. A refused archive is QuineboxError naming the member, and
    nothing of it is written; one past `max_bytes` FileTooLargeError."""
    from quinebox import untar  # its source goes into the box with the exec

    err = Taken(None, ERR_MAX)
    code_of_untar = _source_of(untar.__file__)
    proc = _start(where, files_command("puttar", _absolute(where, path), str(max_bytes), code_of_untar), stdin=PIPE, stdout=DEVNULL, stderr=err, user=user)
    failed: list[BaseException] = []
    feeder = threading.Thread(target=_feed, args=(fileobj, proc, failed), daemon=True)
    feeder.start()
    code = proc.wait_drained(timeout)
    feeder.join()  # the exec is over, so its writes fail at once: never left reading the caller's stream after this returns
    _close(proc.stdin)
    if failed:  # the caller's stream broke part-way: the exec was killed before it saw an end, so nothing half-read is unpacked
        raise failed[0]
    if code == TOO_LARGE:
        raise FileTooLargeError(path, None, max_bytes, "give max_bytes=N")
    if code == REFUSED:
        raise QuineboxError(f"refused the archive for {path} in the box: {err.text().rpartition(':')[0] or err.text()}")
    _raise(code, path, err, proc.timed_out, timeout, "unpacking into")


@functools.cache
def _source_of(file: str) -> str:
    with open(file, encoding="utf-8") as f:
        return f.read()


def _feed(source: IO[bytes], proc: Started, failed: list[BaseException]) -> None:
    """The caller's archive into the exec's stdin, until it ends or the exec stops reading. When the caller's stream
    fails, its error is kept for the caller and the exec killed before its stdin is closed: an end of input there
    would let a tar cut at a member's boundary unpack as if whole."""
    sink = proc.stdin
    assert sink is not None
    while True:
        try:
            chunk = source.read(1 << 16)
        except BaseException as exc:  # noqa: BLE001 raised again in put_tar's thread
            failed.append(exc)
            proc.kill()  # stdin stays open until the exec is gone (put_tar closes it)
            return
        if not chunk:
            break
        try:
            view = memoryview(chunk)
            while view:
                view = view[sink.write(view) or 0 :]
        except (OSError, ValueError):
            break  # the exec ended (refused, or past its cap or deadline): what it said is what counts
    _close(sink)


def _close(stream: IO[bytes] | None) -> None:
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass
