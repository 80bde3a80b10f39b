"""The command server's wire: one frame at a time, with file descriptors riding along (SCM_RIGHTS).

The thin client (client.py) speaks it to `quinebox serve` (cli/server.py) for every command it hands over, so
it is built for start-up: `_socket` and `marshal` only, neither json nor the socket module (each pulls in
enum and re, a third of the client's start-up). A frame is its length (4 bytes, big-endian) and a marshal'd
dict of strings, numbers, lists and dicts. Both ends are one user's (the server answers its own uid only, and
the client sends nothing to a server of another: `connect`) and one quinebox's (a server whose code differs hands a request back unrun: cli/freshness.py); a frame larger than
MAX_FRAME, or one that does not load as a dict, reads as {}, which neither end acts on.
"""

from __future__ import annotations

import _socket
import marshal
import os
import sys

TYPE_CHECKING = False  # typing itself is not imported: the thin client's start-up counts
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: A request bigger than this is not one of ours (a client's whole environment fits many times over).
MAX_FRAME = 4 << 20
#: The most descriptors one frame carries: a client's stdin, stdout, stderr and terminal, and (to a worker forked
#: ahead: cli/server.py's Spare) the client's connection.
MAX_FDS = 5
_INT = 4


def connect(path: str) -> _socket.socket | None:
    """A connection to the server listening at `path`, or None when nothing answers there. One that answers as
    another user's process (SO_PEERCRED, read before a byte is sent: no stdio, argv or environment reaches it) is
    closed at once and refused, StateError in one line."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
        uid = peer_uid(conn)
    except OSError:
        conn.close()
        return None
    if uid != os.geteuid():
        conn.close()
        from quinebox.errors import StateError

        raise StateError(f"the command server's socket {path} answers as uid {uid}, not as you (uid {os.geteuid()}), and was sent nothing: remove it")
    return conn


def peer_uid(sock: Any) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: its pid, uid and gid, as it connected
    or listened)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * _INT)
    return int.from_bytes(creds[_INT : 2 * _INT], sys.byteorder)


def send(sock: Any, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One frame on `sock` (a socket of either module); `fds` go with its first bytes."""
    data = marshal.dumps(message)
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
    try:
        message = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return {}, fds
    return (message if isinstance(message, dict) else {}), fds


def ask(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One message to the server at `path` and its answer: None when nothing answers there, {} when the answer
    is none of ours (or does not come in time)."""
    conn = connect(path)
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
