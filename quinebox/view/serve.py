"""Serving the view: a listening socket first (so `--port 0` can print the port it got), then uvicorn on it."""

from __future__ import annotations

import secrets
import socket
import sys
import threading
import webbrowser
from collections.abc import Callable

from quinebox.view.app import Settings, make_app

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening: connections made before uvicorn starts wait in its backlog."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def url_of(sock: socket.socket, token: str, session: str | None) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}" + (f"#/s/{session}" if session else "")


def serve(
    *, host: str = "127.0.0.1", port: int = 0, session: str | None = None, allow_approve: bool = False, open_browser: bool = False,
    announce: Callable[[str], None] = lambda url: print(f"quinebox view: {url}", flush=True),
) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM end it cleanly)."""
    import uvicorn

    token = secrets.token_urlsafe(24)
    sock = listen(host, port)
    try:
        app = make_app(Settings(token=token, allow_approve=allow_approve, port=sock.getsockname()[1]))
    except BaseException:
        sock.close()
        raise
    url = url_of(sock, token, session)
    if host not in LOOPBACK:
        print(f"quinebox: warning: the view listens on {host}, beyond this machine; anyone who learns its URL can read every session", file=sys.stderr, flush=True)
    announce(url)
    if open_browser:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
