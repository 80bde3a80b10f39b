"""The box's way out: connections made to the forwarder on the box's own loopback are handed to the host.

The box has no network. QUINEBOX_EGRESS (127.0.0.1:3128) is where HTTP_PROXY,
HTTPS_PROXY and ALL_PROXY point; each connection accepted there is passed, as
the socket itself (SCM_RIGHTS), over the box's egress socket to the host's
egress proxy (box/net/egress.py), which decides it and then reads and writes it
directly. Nothing is decided here, and no byte is copied here: this runs inside
the box, and the box could hand the host any socket of its own instead.

Stdlib only, small, no state.
"""

import errno
import os
import socket
import threading

EGRESS_SOCKET = "/run/quinebox/egress.sock"
#: How long `stop` lets the connection being handed over finish (the host takes one within seconds, or drops it).
HANDOVER_GRACE = 10.0

_handing: dict[int, threading.Thread] = {}  # each listener's thread, by the listener's fd


def start(shared=False):
    """Listen where QUINEBOX_EGRESS says, if it says; hand each connection to the host on a thread of its own.

    `shared`: the box's lifeline may hold the listener already (an agent under it), and then that one serves."""
    listen = os.environ.get("QUINEBOX_EGRESS")
    if not listen:
        return None
    address, _, port = listen.rpartition(":")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, int(port)))
    except OSError as exc:
        server.close()
        if shared and exc.errno == errno.EADDRINUSE:
            return None
        os.write(2, f"quinebox: no egress: cannot listen on {listen}: {exc.strerror}\n".encode())
        return None
    server.listen(128)
    thread = threading.Thread(target=_hand_over, args=(server,), daemon=True)
    thread.start()
    _handing[server.fileno()] = thread
    return server


def stop(server):
    """Hand nothing more over (a checkpoint is taken: guest/checkpoints.py): the listener shut, the connection
    being handed over let finish. Clients meanwhile are refused at once, and try again as after any refusal."""
    thread = _handing.pop(server.fileno(), None)
    try:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept below, which a close alone would not
    except OSError:
        pass
    server.close()
    if thread is not None:
        thread.join(HANDOVER_GRACE)


def _hand_over(server):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            host.connect(EGRESS_SOCKET)
            socket.send_fds(host, [b"c"], [conn.fileno()])
        except OSError:
            pass  # the host is gone: the connection closes unanswered
        finally:
            host.close()
            conn.close()
