"""Unix sockets between quinebox's own processes: one frame at a time, with file descriptors riding along (SCM_RIGHTS).

Every conversation of quinebox's processes with each other goes this way: the thin client (client.py) handing a
command to `quinebox serve` (cli/server.py), a claimer and the pool's keeper (box/pool/), a process and a
long-lived box's owner (box/live/controls.py). A frame is its length (4 bytes, big-endian) and a marshal'd dict
of what JSON would carry (strings, numbers, booleans, None, lists and dicts; a tuple goes as a list); a frame
larger than MAX_FRAME, or one that does not load as a dict, reads as {}, which no end acts on.

Built for the thin client's start-up: importing it costs `_socket` and `marshal` only, neither json nor the socket
module (each pulls in enum and re, a third of the client's start-up); what only a server needs (`listen`,
`unfree`) imports the rest when it is called.

Each socket is its user's alone: born with its mode (`listen`), sent nothing when another user answers on it
(`connect`: StateError, in one line), and answered only to a peer as free as the server (`unfree`). Both ends are
one user's, and so marshal, which trusts what it loads, loads only what that user's own processes sent.
"""

from __future__ import annotations

import _socket
import errno
import marshal
import os
import sys

TYPE_CHECKING = False  # typing itself is not imported: the thin client's start-up counts
if TYPE_CHECKING:
    import socket
    from collections.abc import Sequence
    from typing import Any, TypeVar, overload

    Conn = TypeVar("Conn", bound=_socket.socket)

#: A frame bigger than this is not one of ours (a client's whole environment fits many times over).
MAX_FRAME = 4 << 20
#: The most descriptors one frame carries: a client's stdin, stdout, stderr and terminal, and (to a worker forked
#: ahead: cli/server.py's Spare) the client's connection; a box's three sockets.
MAX_FDS = 5
#: The longest path a Unix socket may have (sun_path's 108 bytes, less its terminating NUL).
MAX_SOCKET_PATH = 107
_INT = 4


def listen(path: str, *, mode: int, backlog: int, owner: tuple[int, int] | None = None) -> socket.socket:
    """A socket listening at `path` (a stale one there is replaced), its file given `mode` and, if given, `owner`
    (uid, gid). The file is born with `mode` (at most: the umask may take from it, and is then undone): the socket's
    own inode is given it before bind, which is where a Unix socket's file takes its mode from, so no one else can
    connect in the moment between bind and chmod. A path too long for a Unix socket is the state dir's (every socket
    of ours is in it): StateError, saying so in one line."""
    import socket

    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        from quinebox.errors import StateError

        raise StateError(
            f"the state dir's path is too long for the Unix socket {path} ({len(os.fsencode(path))} bytes, at most {MAX_SOCKET_PATH}): "
            "set QUINEBOX_STATE_DIR to a shorter path"
        )
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(listener.fileno(), mode)
        listener.bind(path)
        if owner is not None:
            os.chown(path, *owner, follow_symlinks=False)
        os.chmod(path, mode)  # what the umask took, given back (a socket is never a link: bind made it just now)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener


if TYPE_CHECKING:

    @overload
    def connect(path: str) -> socket.socket | None: ...

    @overload
    def connect(path: str, kind: type[Conn]) -> Conn | None: ...


def connect(path: str, kind: Any = None) -> Any:
    """A connection to the server listening at `path`, or None when nothing answers there. One that answers as
    another user's process (SO_PEERCRED, read before a byte is sent: nothing of ours reaches it) is closed at once
    and refused, StateError in one line: every socket of ours is its owner's.

    `kind`: the class of the connection, a `socket.socket` unless told (the thin client asks for `_socket.socket`,
    which needs no import of the socket module)."""
    if kind is None:
        import socket

        kind = socket.socket
    conn = kind(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
        uid = peer_uid(conn)
    except OSError:
        conn.close()
        return None
    if uid != os.geteuid():
        conn.close()
        raise foreign(path, uid)
    return conn


def foreign(path: str, uid: int) -> Exception:
    """The StateError for a socket of ours that answers as another user's process (`connect`; the native client,
    bin/quinebox.c, finds it too and has client.py say it)."""
    from quinebox.errors import StateError

    return StateError(f"the socket {path} answers as uid {uid}, not as you (uid {os.geteuid()}), and was sent nothing: remove it")


def peer_uid(sock: Any) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: its pid, uid and gid, as it connected
    or listened): servers answer their owner only."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * _INT)
    return int.from_bytes(creds[_INT : 2 * _INT], sys.byteorder)


def peer_pid(sock: Any) -> int:
    """The pid, in this process's pid namespace, of the process at the other end of a Unix socket as it connected
    (SO_PEERCRED): only while that process is known to live does it name it."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * _INT)
    return int.from_bytes(creds[:_INT], sys.byteorder)


def unfree(sock: Any) -> str | None:
    """Why the process at the other end of `sock` is less free than this one, in a few words, or None when it is as
    free: the same uid, the same mount, pid, user and network namespaces and root, no NoNewPrivs, seccomp mode or
    seccomp filter this process has not, no capability (effective or bounding) this one has that it lacks, and the
    same LSM label. A server acting for a less free peer would lend it its own freedom (chg's hole): a sandboxed
    agent, given no write access anywhere, had a command server write a host file for it.

    Landlock is not told anywhere (not /proc/PID/status, nor /proc/PID/attr, as of Linux 6.18), but a process that
    is not root can confine itself with Landlock only after setting NoNewPrivs (landlock_restrict_self(2)), which is
    compared; a root process with CAP_SYS_ADMIN need not, and such a one is not seen.

    The peer is the process that connected (SO_PEERCRED's pid), held by a pidfd while /proc is read (SO_PEERPIDFD,
    Linux ≥ 6.5) and seen still alive after: its pid cannot have been reused by another process meanwhile. On an
    older kernel the pid alone is read. Costs about a tenth of a millisecond."""
    import signal  # its module imports enum: a server's cost, not the thin client's
    import struct

    pid, uid, _ = struct.unpack("iII", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("iII")))
    if uid != os.geteuid():
        return f"uid {uid}"
    if pid <= 0:
        return "a process outside this pid namespace"
    try:
        pidfd: int | None = sock.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:
            return "a process that is gone"
        pidfd = None  # Linux < 6.5
    try:
        theirs = _freedom(str(pid))
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, 0)  # ProcessLookupError once it is gone: its pid may be another's now
    except OSError:
        return "a process whose /proc this one may not read, or that is gone"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    mine = _mine()
    for name in NAMESPACES:
        if theirs[name] != mine[name]:
            return f"another {name} namespace"
    if theirs["root"] != mine["root"]:
        return "another root directory (chroot)"
    if theirs["label"] != mine["label"]:
        return f"another LSM label ({theirs['label']!r})"
    for field, what in (("NoNewPrivs", "NoNewPrivs"), ("Seccomp", "a seccomp mode"), ("Seccomp_filters", "more seccomp filters")):
        if int(theirs.get(field, "0")) > int(mine.get(field, "0")):
            return what
    for field in ("CapEff", "CapBnd"):
        missing = int(mine.get(field, "0"), 16) & ~int(theirs.get(field, "0"), 16)
        if missing:
            return f"fewer capabilities ({field} lacks {missing:#x})"
    return None


#: SO_PEERPIDFD (Linux ≥ 6.5), which Python's socket module does not name: a pidfd of the peer as it connected.
SO_PEERPIDFD = 77
#: The namespaces a peer must share with this process: another mount, pid, user or network namespace is another
#: view of the system than the one this process acts in (ipc, uts and cgroup namespaces confine nothing it does for one).
NAMESPACES = ("mnt", "pid", "user", "net")
_STATUS = ("NoNewPrivs", "Seccomp", "Seccomp_filters", "CapEff", "CapBnd")
#: This process's own freedom, read once (it does not change, and a fork has its parent's).
_own: dict[str, str] = {}


def _mine() -> dict[str, str]:
    if not _own:
        _own.update(_freedom("self"))
    return _own


def _freedom(pid: str) -> dict[str, str]:
    """What `unfree` compares of process `pid` ("self": this one). OSError when it cannot be read."""
    found = {name: os.readlink(f"/proc/{pid}/ns/{name}") for name in NAMESPACES}
    root = os.stat(f"/proc/{pid}/root")
    found["root"] = f"{root.st_dev}:{root.st_ino}"
    try:
        with open(f"/proc/{pid}/attr/current", "rb") as attr:
            found["label"] = attr.read().decode(errors="replace").strip("\0\n")
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):  # no LSM that labels processes
            raise
        found["label"] = ""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            field, _, value = line.partition(":")
            if field in _STATUS:
                found[field] = value.strip()
    return found


def send(sock: Any, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One frame on `sock` (a socket of either module); `fds` go with its first bytes."""
    data = marshal.dumps(_plain(message))
    frame = len(data).to_bytes(_INT, "big") + data
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(fd.to_bytes(_INT, sys.byteorder, signed=True) for fd in fds))] if fds else []
    sent = sock.sendmsg([frame], ancillary)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def receive(sock: Any, timeout: float | None) -> tuple[dict[str, Any], list[int]]:
    """The next frame's message ({} at the peer's end, or when it is none of ours) and the descriptors that came
    with it. TimeoutError when none comes within `timeout` seconds (None: wait)."""
    fds: list[int] = []
    sock.settimeout(timeout)
    try:
        header = _exact(sock, _INT, fds)
        size = int.from_bytes(header, "big") if len(header) == _INT else 0
        if not 0 < size <= MAX_FRAME:
            return {}, fds
        body = _exact(sock, size, fds)
    finally:
        sock.settimeout(None)
    if len(body) != size:  # the peer's end came first: a marshal'd prefix may still load, and would be half a message
        return {}, fds
    try:
        message = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return {}, fds
    return (message if isinstance(message, dict) else {}), fds


def ask(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One message to the server at `path` and its answer: None when nothing answers there, {} when the answer
    is none of ours (or does not come in time). StateError, as `connect`'s, when another user's process answers."""
    conn = connect(path, _socket.socket)
    if conn is None:
        return None
    try:
        send(conn, message)
        answer, fds = receive(conn, timeout)
    except OSError:
        return {}
    finally:
        conn.close()
    for fd in fds:
        os.close(fd)
    return answer


def _exact(sock: Any, size: int, fds: list[int]) -> bytes:
    """`size` bytes (fewer at the peer's end), gathering the descriptors that ride along."""
    data = b""
    while len(data) < size:
        chunk, ancillary, _, _ = sock.recvmsg(size - len(data), _socket.CMSG_SPACE(MAX_FDS * _INT))
        for level, kind, blob in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                whole = len(blob) - len(blob) % _INT
                fds += [int.from_bytes(blob[i : i + _INT], sys.byteorder, signed=True) for i in range(0, whole, _INT)]
        if not chunk:
            break
        data += chunk
    return data


def _plain(value: Any) -> Any:
    """`value` as JSON would carry it: tuples as lists, all the way down (a receiver checks for a list, as it did
    when these frames were JSON lines)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
