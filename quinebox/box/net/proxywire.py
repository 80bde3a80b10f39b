"""What the egress proxy reads and writes on the wire: request heads, SOCKS fields, names resolved, the refusal it answers
with, and the bytes it splices back to the box."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import urllib.parse
from collections.abc import Callable
from typing import IO

from quinebox.netrules import Address

HEAD_MAX = 64 << 10
SPLICE_CHUNK = 1 << 20
F_SETPIPE_SZ = 1031
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade"}


class Refused(Exception):
    """A connection the box may not make, or (`fault`) one the outside did not let it make; `status` is the HTTP answer to it."""

    def __init__(self, message: str, status: int = 403, socks: int = 2, exfiltration: str | None = None, *,
                 destination: str = "", fault: bool = False):
        super().__init__(message)
        self.status = status
        self.socks = socks
        #: The secret whose placeholder was sent where it does not go.
        self.exfiltration = exfiltration
        #: HOST:PORT the box asked for, when it got that far.
        self.destination = destination
        #: A network fault (no such name, nobody listening), not a decision: said as "failed", never as "refused".
        self.fault = fault


def resolve(name: str, port: int) -> list[Address]:
    """Addresses for `name`: the hosts override first, then the system's resolver (the host's, never the box's)."""
    override = os.environ.get("QUINEBOX_EGRESS_HOSTS")
    if override:
        try:
            lines = open(override).read().splitlines()
        except OSError:
            lines = []
        found = []
        for line in lines:
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and name in (f.lower() for f in fields[1:]):
                try:
                    found.append(ipaddress.ip_address(fields[0]))
                except ValueError:
                    continue
        if found:
            return found
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(f"egress to {name}:{port} failed: cannot resolve {name} ({exc})", status=502, socks=4, destination=f"{name}:{port}", fault=True) from None
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))


def parse_head(head: bytes) -> tuple[str, str, str, list[list[str]], dict[str, str]]:
    """(method, target, version, [[name, value]], {lower-case name: value}) of a request head."""
    request_line, _, rest = head.partition(b"\r\n")
    try:
        method, target, version = request_line.decode("latin-1").split(" ")
    except ValueError:
        raise Refused("egress refused: not an HTTP request", status=400, socks=1) from None
    headers = [[k.strip(), v.strip()] for k, v in (line.split(":", 1) for line in rest.decode("latin-1").split("\r\n") if ":" in line)]
    return method, target, version, headers, {k.lower(): v for k, v in headers}


def forward_head(method: str, target: str, version: str, host: str, headers: list[list[str]]) -> bytes:
    """The head sent on: origin-form, the Host given, hop-by-hop headers gone, and the connection closed after it."""
    kept = [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() != "host"]
    return "\r\n".join([f"{method} {target} {version}", f"Host: {host}", *kept, "Connection: close", "", ""]).encode("latin-1")


def swap(value: str, real: dict[str, str]) -> str:
    for placeholder, secret in real.items():
        value = value.replace(placeholder, secret)
    return value


def read_head(reader: IO[bytes]) -> bytes:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline(HEAD_MAX)
        if not line:
            raise EOFError
        head += line
        if len(head) > HEAD_MAX:
            raise Refused("egress refused: request head too large", status=400)
    return head


def exactly(reader: IO[bytes], size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise EOFError
    return data


def host_port(text: str, default: int | None) -> tuple[str, int]:
    """(host, port) of `host:port`, `[v6]:port` or a bare host (with `default`)."""
    parsed = urllib.parse.urlsplit("//" + text.strip())
    try:
        port = parsed.port
    except ValueError:
        port = None
    chosen = port if port is not None else default
    if parsed.hostname is None or chosen is None:
        raise Refused(f"egress refused: {text[:100]!r} is not HOST:PORT", status=400, socks=1)
    return parsed.hostname.lower().rstrip("."), chosen


def answer(conn: socket.socket, exc: Refused, socks: bool) -> None:
    """The box's answer to a refusal: a SOCKS reply, or an HTTP status whose body is the one line that says why."""
    if socks:
        conn.sendall(b"\x05" + bytes([exc.socks]) + b"\x00\x01" + bytes(6))
        return
    body = (str(exc) + "\n").encode()
    reason = {400: "Bad Request", 403: "Forbidden", 411: "Length Required", 502: "Bad Gateway"}.get(exc.status, "Forbidden")
    conn.sendall(f"HTTP/1.1 {exc.status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


def splice(source: socket.socket, sink: socket.socket, moved: dict[str, int], count: Callable[[int], bool]) -> None:
    """From the outside back to the box, in the kernel (splice through a pipe): the bulk of the bytes go this way.
    `count` is told each chunk's size and says whether the box may still move more."""
    pipe_r, pipe_w = os.pipe()
    try:
        fcntl.fcntl(pipe_w, F_SETPIPE_SZ, SPLICE_CHUNK)
        source.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * SPLICE_CHUNK)
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * SPLICE_CHUNK)
    except OSError:
        pass
    try:
        while True:
            size = os.splice(source.fileno(), pipe_w, SPLICE_CHUNK)
            if not size or not count(size):
                break
            moved["down"] += size
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
