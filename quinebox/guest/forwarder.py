"""The box's way out: a relay on the box's own loopback to the host's egress proxy.

The box has no network. Each connection made to QUINEBOX_EGRESS (127.0.0.1:3128,
which HTTP_PROXY, HTTPS_PROXY and ALL_PROXY name) is relayed byte for byte
over a connection of its own to the host socket, where the host decides it
(box/egress.py). Nothing is decided here: this runs inside the box, and the
box could go around it to the host socket with the same result.

Stdlib only, small, no state.
"""

import fcntl
import os
import socket
import threading

import protocol

CHUNK = 1 << 20
F_SETPIPE_SZ = 1031


def start(host_socket):
    """Listen where QUINEBOX_EGRESS says, if it says; relay each connection on threads of its own."""
    listen = os.environ.get("QUINEBOX_EGRESS")
    if not listen:
        return None
    address, _, port = listen.rpartition(":")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, int(port)))
    except OSError as exc:
        os.write(2, f"quinebox: no egress: cannot listen on {listen}: {exc.strerror}\n".encode())
        server.close()
        return None
    server.listen(128)
    threading.Thread(target=_accept, args=(server, host_socket), daemon=True).start()
    return server


def _accept(server, host_socket):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(conn, host_socket), daemon=True).start()


def _relay(conn, host_socket):
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        host.connect(host_socket)
        host.sendall(protocol.encode({"kind": "egress"}))
    except OSError:
        conn.close()
        host.close()
        return
    up = threading.Thread(target=_pipe, args=(conn, host), daemon=True)
    up.start()
    _pipe(host, conn)
    up.join()
    conn.close()
    host.close()


def _pipe(source, sink):
    """In the kernel: splice from one socket through a pipe into the other."""
    pipe_r, pipe_w = os.pipe()
    try:
        fcntl.fcntl(pipe_w, F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass
    try:
        while True:
            size = os.splice(source.fileno(), pipe_w, CHUNK)
            if not size:
                break
            while size:
                size -= os.splice(pipe_r, sink.fileno(), size)
    except OSError:
        pass
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
