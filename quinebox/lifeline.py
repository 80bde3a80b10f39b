"""The host end of a box's socket: while this process lives, the box may live.

The guest's init connects here first thing and treats EOF as "the host is
gone". The kernel closes our end however this process dies, SIGKILL included,
so the guarantee needs no cooperation from us beyond holding the connection.
Whatever a guest sends is read and dropped; it can never block or crash the host.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading


class LifelineServer:
    def __init__(self, path: str):
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self._listener.bind(path)
        # The box's uid may differ from ours; the run dir (0700) keeps everyone
        # else out, and the box reaches the socket only through its bind mount.
        os.chmod(path, 0o666)
        self._listener.listen(8)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name=f"lifeline:{os.path.basename(path)}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.fileobj == self._wake_r:
                    return
                if key.fileobj is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    self._selector.register(conn, selectors.EVENT_READ)
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._selector.unregister(conn)
                    conn.close()

    def close(self) -> None:
        """Drop every connection (a box still attached will kill itself) and remove the socket."""
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join()
        for key in list(self._selector.get_map().values()):
            if key.fileobj not in (self._wake_r,):
                key.fileobj.close()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
