"""Unix sockets between quinebox's own processes: one JSON line, with file descriptors riding along (SCM_RIGHTS).

The thin client hands its stdio to the command server this way, and the pool
hands a claimed box's sockets to whoever claimed it. Stdlib only: the thin
client imports it on its fast path.
"""

from __future__ import annotations

import array
import json
import os
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


def listen(path: str, *, mode: int, backlog: int) -> socket.socket:
    """A socket listening at `path` (a stale one there is replaced), its file given `mode`. A path too long for
    a Unix socket is the state dir's (every socket of ours is in it): StateError, saying so in one line."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        from quinebox.errors import StateError

        raise StateError(f"the state dir's path is too long for the Unix socket {path} ({len(os.fsencode(path))} bytes, at most {MAX_SOCKET_PATH}): set QUINEBOX_STATE_DIR to a shorter path")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, mode)
    listener.listen(backlog)
    return listener


def connect(path: str) -> socket.socket | None:
    """A connection to the Unix socket at `path`, or None when nothing answers there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED): servers answer their owner only."""
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


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
