"""For tests/e2e/test_view.py: `quinebox view` started and stopped by its PID, Debian's Chromium driven by
Playwright, every request the page makes recorded, and plain HTTP without the browser.

The browser is /usr/bin/chromium (scripts/test.sh installs Debian's package); a missing one is a failure,
never a skip: these tests are how the page is known to work.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from commands import QUINEBOX

CHROMIUM = os.environ.get("QUINEBOX_TEST_CHROMIUM", "/usr/bin/chromium")
#: As root Chromium needs --no-sandbox; the rest keep it from reaching anywhere on its own (updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
    "--disable-dev-shm-usage", "--mute-audio",
]
#: How long the page may take to show what it is waiting for (a page over a real run: a few seconds at most).
WAIT_MS = 30_000
LINE = re.compile(r"quinebox view: (http://[^/\s]+)/\?token=(\S+)")


def chromium_path() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/test.sh installs Debian's package (apt-get install chromium)", pytrace=False)
    return CHROMIUM


class ViewServer:
    """`quinebox view --port 0 ARGS`, its URL read from the one line it prints; stopped by its PID."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, within: float = 60.0):
        self.errfile = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [QUINEBOX, "view", "--port", "0", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.errfile,
            env=env, start_new_session=True,
        )
        self.pid = self.proc.pid
        said = b""
        until = time.monotonic() + within
        while b"\n" not in said and time.monotonic() < until and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                said += chunk
        found = LINE.search(said.decode(errors="replace"))
        if not found:
            self.stop()
            pytest.fail(f"quinebox view printed no URL within {within:g} s: stdout {said!r}, stderr {self.stderr()[-2000:]!r}", pytrace=False)
        self.origin, self.token = found.group(1), found.group(2)
        self.url = f"{self.origin}/?token={self.token}"
        #: The token's cookie: named for the port, since a browser sends a host's cookies to all of its ports.
        self.cookie = f"quinebox_view_token_{self.origin.rsplit(':', 1)[1]}"

    def stderr(self) -> str:
        self.errfile.seek(0)
        return self.errfile.read().decode(errors="replace")

    def page_url(self, route: str = "#/") -> str:
        return f"{self.url}{route}"

    def get(self, path: str, *, token: str | None = "", headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes, dict[str, str]]:
        """GET `path` with this server's token as a Bearer header (token=""), another token, or none (None)."""
        return self.request("GET", path, token=token, headers=headers, timeout=timeout)

    def json(self, path: str) -> Any:
        status, body, _ = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def request(self, method: str, path: str, *, token: str | None = "", headers: dict[str, str] | None = None, body: bytes | None = None,
                timeout: float = 30) -> tuple[int, bytes, dict[str, str]]:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token or self.token}"
        request = urllib.request.Request(self.origin + path, data=body, method=method, headers=sent)
        try:
            with _opener.open(request, timeout=timeout) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), dict(exc.headers)

    def events(self, topics: str, seconds: float) -> bytes:
        """The raw bytes /api/events?topics=… sends in `seconds` (a stream that never ends by itself), headers included."""
        import socket

        host, port = urllib.parse.urlsplit(self.origin).netloc.rsplit(":", 1)
        got = b""
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            path = f"/api/events?topics={urllib.parse.quote(topics)}"
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n".encode())
            until = time.monotonic() + seconds
            while (left := until - time.monotonic()) > 0:
                if not select.select([sock], [], [], left)[0]:
                    break
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        if self.proc.stdout:
            self.proc.stdout.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect is an answer to look at, not to follow
        return None


_opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


@contextmanager
def view_server(*args: str, env: dict[str, str] | None = None) -> Iterator[ViewServer]:
    server = ViewServer(*args, env=env)
    try:
        yield server
    finally:
        server.stop()


class Recorded:
    """Every request a browser context makes (the browser's own network log), and every load of a top-level page."""

    def __init__(self, context):
        self.requests: list[str] = []
        self.sockets: list[str] = []
        self.responses: list[Any] = []
        context.on("request", lambda request: self.requests.append(request.url))
        context.on("response", lambda response: self.responses.append(response))
        context.on("page", self.watch)

    def watch(self, page) -> None:
        page.on("websocket", lambda socket: self.sockets.append(socket.url))

    def foreign(self, origin: str) -> list[str]:
        """Requests to anywhere but `origin` (a file:// page's own files count as its origin "file://")."""
        allowed = origin.rstrip("/") + "/"
        return [url for url in self.requests + self.sockets if not url.startswith(allowed)]


class Browser:
    """Chromium launched once for the module; each test gets a fresh context (no cookies) with its requests recorded."""

    def __init__(self):
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self.chromium = self._playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, timeout=60_000)

    def context(self, **kwargs):
        context = self.chromium.new_context(viewport={"width": 1280, "height": 800}, **kwargs)
        context.set_default_timeout(WAIT_MS)
        return context, Recorded(context)

    def close(self) -> None:
        try:
            self.chromium.close()
        finally:
            self._playwright.stop()


def open_page(context, url: str, route: str | None = None):
    """A page at `url`, its first render done (body[data-ready="1"]), counting its loads (window.__loads)."""
    page = context.new_page()
    page.loads = 0  # type: ignore[attr-defined]

    def loaded():
        page.loads += 1  # type: ignore[attr-defined]

    page.on("load", lambda _: loaded())
    page.goto(url)
    ready(page, route)
    return page


def ready(page, route: str | None = None) -> None:
    selector = 'body[data-ready="1"]' + (f'[data-route="{route}"]' if route else "")
    page.wait_for_selector(selector, state="attached")


def go(page, route: str, name: str) -> None:
    """A new hash route in the same page (no reload), its first render done."""
    page.evaluate("route => { document.body.removeAttribute('data-ready'); location.hash = route; }", route)
    ready(page, name)


def export_files(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def no_foreign(recorded, origin: str) -> None:
    """The browser made requests, and every one went to `origin`."""
    foreign = recorded.foreign(origin)
    assert recorded.requests, "the browser recorded no request at all"
    assert foreign == [], f"the page reached beyond {origin}: {foreign}"
