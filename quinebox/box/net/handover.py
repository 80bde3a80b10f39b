"""Taking a box's outgoing connections: the guest's forwarder hands over each socket it accepted (SCM_RIGHTS).

What arrives is untrusted: one fd per hand-over is taken, and only if it is a
TCP socket; anything else is closed unread, and a peer that sends nothing is
dropped after a few seconds.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable

from quinebox.box.net.broker import box_peer, box_socket


class Handover:
    """A listening socket at `path`; `serve(conn)` runs on a thread of its own for each TCP socket handed over."""

    def __init__(self, path: str, serve: Callable[[socket.socket], None], owner: tuple[int, int] | None = None):
        """`owner`: the host's (uid, gid) of the box's user, who alone (and the host) may hand over (box_socket)."""
        self.path = path
        self._serve = serve
        self._owner = owner
        self._listener = box_socket(path, backlog=64, owner=owner)
        threading.Thread(target=self._accept, name=f"handover:{os.path.basename(path)}", daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                handing, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                handing.settimeout(5)
                _, fds, _, _ = socket.recv_fds(handing, 1, 4) if box_peer(handing, self._owner) else (b"", [], 0, None)
            except (OSError, ValueError):
                fds = []
            finally:
                handing.close()
            for extra in fds[1:]:
                os.close(extra)
            if fds:
                self._take(fds[0])

    def _take(self, fd: int) -> None:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise ValueError("not a socket")
            conn = socket.socket(fileno=fd)
        except (OSError, ValueError):
            os.close(fd)
            return
        if conn.type != socket.SOCK_STREAM or conn.family not in (socket.AF_INET, socket.AF_INET6):
            conn.close()
            return
        threading.Thread(target=self._serve, args=(conn,), name="egress", daemon=True).start()
