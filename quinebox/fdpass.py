"""Unix sockets between quinebox's own processes: one JSON line, with file descriptors riding along (SCM_RIGHTS).

The pool hands a claimed box's sockets to whoever claimed it this way, and a
long-lived box's owner answers for it (box/live/controls.py). Each socket is
its user's alone: born with its mode (`listen`), sent nothing when another
user answers on it (`connect`), and answered only to a peer as free as the
server (`unfree`). Stdlib only.
"""

from __future__ import annotations

import array
import errno
import json
import os
import signal
import socket

TYPE_CHECKING = False  # typing itself is not imported: the thin client's start-up counts
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: A request bigger than this is not one of ours.
MAX_MESSAGE = 4 << 20
#: The most descriptors one message carries (stdio and a terminal; a box's three sockets).
MAX_FDS = 4
#: The longest path a Unix socket may have (sun_path's 108 bytes, less its terminating NUL).
MAX_SOCKET_PATH = 107


def listen(path: str, *, mode: int, backlog: int, owner: tuple[int, int] | None = None) -> socket.socket:
    """A socket listening at `path` (a stale one there is replaced), its file given `mode` and, if given, `owner`
    (uid, gid). The file is born with `mode` (at most: the umask may take from it, and is then undone): the socket's
    own inode is given it before bind, which is where a Unix socket's file takes its mode from, so no one else can
    connect in the moment between bind and chmod. A path too long for a Unix socket is the state dir's (every socket
    of ours is in it): StateError, saying so in one line."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        from quinebox.errors import StateError

        raise StateError(f"the state dir's path is too long for the Unix socket {path} ({len(os.fsencode(path))} bytes, at most {MAX_SOCKET_PATH}): set QUINEBOX_STATE_DIR to a shorter path")
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


def connect(path: str) -> socket.socket | None:
    """A connection to the Unix socket at `path`, or None when nothing answers there, or when what answers is
    another user's process (SO_PEERCRED, read before a byte is sent): every socket of ours is its owner's."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        if peer_uid(conn) == os.geteuid():
            return conn
    except OSError:
        pass
    conn.close()
    return None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED): servers answer their owner only."""
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3I", creds)[1]


def unfree(sock: socket.socket) -> str | None:
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
    import struct

    pid, uid, _ = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII")))
    if uid != os.geteuid():
        return f"uid {uid}"
    if pid <= 0:
        return "a process outside this pid namespace"
    try:
        pidfd: int | None = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
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


def ask(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One message to the server at `path` and its answer: None when nothing answers there, {} when the answer
    is not one (or does not come in time)."""
    conn = connect(path)
    if conn is None:
        return None
    with conn:
        try:
            send(conn, message)
            answer, fds = receive(conn, timeout)
        except OSError:
            return {}
    for fd in fds:
        os.close(fd)
    return answer


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def receive(sock: socket.socket, timeout: float | None) -> tuple[dict[str, Any], list[int]]:
    """The next line as a JSON object ({} when it is not one), and the descriptors that came with it.

    A peer sends one line and then waits for the answer, so no chunk holds the start of a second message."""
    sock.settimeout(timeout)
    data, fds = b"", array.array("i")
    try:
        while not data.endswith(b"\n") and len(data) < MAX_MESSAGE:
            chunk, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if not chunk:
                break
            data += chunk
    finally:
        sock.settimeout(None)
    try:
        message = json.loads(data)
    except ValueError:
        message = {}
    return (message if isinstance(message, dict) else {}), list(fds)
