"""The host's egress proxy for one box: each connection the box makes is decided here, at the address it goes to.

The box has no network (mode `none`); the guest's forwarder relays each
connection made to 127.0.0.1:3128 in the box over the box's socket, and this
end speaks HTTP proxying (CONNECT, and absolute-form `http://` requests) and
SOCKS5 on it. Everything is decided here, never in the box: the name is
resolved here (`QUINEBOX_EGRESS_HOSTS`, a file in /etc/hosts format, is read
first), every address is checked against the box's `net` grants
(`netrules.verdict`), and the connection goes to exactly the address checked,
so a name that changes its answer between check and use changes nothing. A
plain-HTTP request's Host header must name what its URL names; one request per
connection, so nothing can follow it unchecked. Refusals answer at once (403
with the grant that would allow it; a SOCKS refusal) and are said on stderr;
every decision is recorded.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import threading
import urllib.parse
from typing import IO, Any, Callable

from quinebox.netrules import Address, NetRule, verdict

#: Connections one box may hold open at once (below the broker's cap on all of a box's connections), and bytes it may move in all.
MAX_CONNECTIONS = 48
MAX_BYTES = int(os.environ.get("QUINEBOX_EGRESS_MAX_BYTES", str(16 << 30)))
HEAD_MAX = 64 << 10
CONNECT_TIMEOUT = 10.0
CHUNK = 1 << 16
SPLICE_CHUNK = 1 << 20
F_SETPIPE_SZ = 1031
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade"}

Record = Callable[[dict[str, Any]], None]


class Refused(Exception):
    """A connection the box may not make; `status` is the HTTP answer to it."""

    def __init__(self, message: str, status: int = 403, socks: int = 2):
        super().__init__(message)
        self.status = status
        self.socks = socks


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
        raise Refused(f"egress to {name}:{port} refused: cannot resolve {name} ({exc})", status=502, socks=4) from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


class Egress:
    """One box's connections to the outside: decided, made, relayed, counted and recorded."""

    def __init__(self, rules: frozenset[NetRule], *, say: Callable[[str], None], record: Record | None = None):
        self.rules = rules
        self._say = say
        self._record = record
        self._lock = threading.Lock()
        self._open = 0
        self.moved = 0
        self._over = False

    def handle(self, conn: socket.socket, reader: IO[bytes]) -> None:
        """One connection from the box's forwarder, its frame already read, until it ends (the caller closes it)."""
        with self._lock:
            full = self._open >= MAX_CONNECTIONS
            self._open += not full
        try:
            if full:
                self._refuse_silently(conn, f"more than {MAX_CONNECTIONS} connections open at once")
                return
            socks = reader.peek(1)[:1] == b"\x05"
            try:
                opened = self._socks(conn, reader) if socks else self._http(conn, reader)
            except Refused as exc:
                self._refused(conn, exc, socks)
                return
            if opened is not None:
                self._relay(conn, reader, *opened)
        except (OSError, ValueError, EOFError):
            pass  # the box went away, or spoke nonsense: nothing to answer
        finally:
            with self._lock:
                self._open -= not full

    # -- deciding and connecting --------------------------------------------------------------

    def _connect(self, host: str, port: int) -> tuple[socket.socket, dict[str, Any]]:
        """A socket to `host`:`port` at an address the grants allow, or Refused naming the grant that would."""
        host = host.strip("[]").lower().rstrip(".")
        if not 0 < port < 65536:
            raise Refused(f"egress to {host}:{port} refused: not a port", status=400, socks=1)
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        name = None if literal else host
        if name is not None and not name.replace("-", "").replace(".", "").isalnum():
            raise Refused(f"egress to {host!r} refused: not a host name", status=400, socks=1)
        addresses = [literal] if literal else resolve(host, port)
        why = f"{host} has no address"
        for address in addresses:
            rule, why = verdict(self.rules, name, address, port)
            if rule is None:
                continue
            upstream = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            upstream.settimeout(CONNECT_TIMEOUT)
            try:
                upstream.connect((str(address), port))
            except OSError as exc:
                upstream.close()
                why = f"{address}:{port} did not accept ({exc.strerror or exc})"
                continue
            upstream.settimeout(None)
            return upstream, {"host": host, "port": port, "address": str(address), "allowed": True, "rule": rule.format()}
        raise Refused(f"egress to {host}:{port} refused: {why}")

    # -- HTTP proxying --------------------------------------------------------------------------

    def _http(self, conn: socket.socket, reader: IO[bytes]) -> tuple[socket.socket, dict[str, Any], bytes, int] | None:
        head = _read_head(reader)
        request_line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = request_line.decode("latin-1").split(" ")
        except ValueError:
            raise Refused("egress refused: not an HTTP proxy request", status=400, socks=1) from None
        headers = [line.split(":", 1) for line in rest.decode("latin-1").split("\r\n") if ":" in line]
        fields = {k.strip().lower(): v.strip() for k, v in headers}
        if method == "CONNECT":
            host, port = _authority(target, None)
            if "host" in fields and _authority(fields["host"], port) != (host, port):
                raise Refused(f"egress refused: CONNECT asks for {target} but its Host header names {fields['host']}", status=400)
            upstream, facts = self._connect(host, port)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            return upstream, facts, b"", -1
        url = urllib.parse.urlsplit(target)
        if url.scheme != "http" or not url.netloc:
            raise Refused(f"egress refused: {target[:100]!r} is not an http:// URL (https goes through CONNECT)", status=400)
        host, port = _authority(url.netloc, 80)
        if "host" in fields and _authority(fields["host"], 80) != (host, port):
            raise Refused(f"egress refused: the request is for {url.netloc} but its Host header names {fields['host']}", status=400)
        if "transfer-encoding" in fields:
            raise Refused("egress refused: a request body must have a Content-Length here", status=411)
        length = int(fields.get("content-length") or 0)
        upstream, facts = self._connect(host, port)
        path = url.path or "/"
        kept = [f"{k.strip()}: {v.strip()}" for k, v in headers if k.strip().lower() not in HOP_BY_HOP and k.strip().lower() != "host"]
        outgoing = "\r\n".join([f"{method} {path}{'?' + url.query if url.query else ''} {version}", f"Host: {url.netloc}", *kept, "Connection: close", "", ""])
        return upstream, facts, outgoing.encode("latin-1"), length

    # -- SOCKS5 -----------------------------------------------------------------------------------

    def _socks(self, conn: socket.socket, reader: IO[bytes]) -> tuple[socket.socket, dict[str, Any], bytes, int] | None:
        _, count = _exactly(reader, 2)
        if 0 not in _exactly(reader, count):
            conn.sendall(b"\x05\xff")
            return None
        conn.sendall(b"\x05\x00")
        _, command, _, kind = _exactly(reader, 4)
        if kind == 1:
            host = str(ipaddress.IPv4Address(_exactly(reader, 4)))
        elif kind == 4:
            host = str(ipaddress.IPv6Address(_exactly(reader, 16)))
        elif kind == 3:
            host = _exactly(reader, _exactly(reader, 1)[0]).decode("ascii", "replace")
        else:
            raise Refused("egress refused: unknown SOCKS address type", socks=8)
        port = int.from_bytes(_exactly(reader, 2), "big")
        if command != 1:
            raise Refused(f"egress to {host}:{port} refused: only SOCKS CONNECT is served", socks=7)
        upstream, facts = self._connect(host, port)
        conn.sendall(b"\x05\x00\x00\x01" + bytes(6))
        return upstream, facts, b"", -1

    # -- answering and relaying ---------------------------------------------------------------------

    def _refused(self, conn: socket.socket, exc: Refused, socks: bool) -> None:
        message = str(exc)
        self._say(message)
        if self._record:
            self._record({"allowed": False, "why": message})
        if socks:
            conn.sendall(b"\x05" + bytes([exc.socks]) + b"\x00\x01" + bytes(6))
        else:
            body = (message + "\n").encode()
            reason = {400: "Bad Request", 403: "Forbidden", 411: "Length Required", 502: "Bad Gateway"}.get(exc.status, "Forbidden")
            conn.sendall(f"HTTP/1.1 {exc.status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

    def _refuse_silently(self, conn: socket.socket, why: str) -> None:
        if self._record:
            self._record({"allowed": False, "why": why})
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def _relay(self, conn: socket.socket, reader: IO[bytes], upstream: socket.socket, facts: dict[str, Any], first: bytes, length: int) -> None:
        """Both ways until either side ends; `length` >= 0: only that many bytes of request body go up."""
        moved = {"up": 0, "down": 0}
        try:
            if first:
                upstream.sendall(first)
            up = threading.Thread(target=self._pump, args=(reader, upstream, moved, "up", length), daemon=True)
            up.start()
            self._splice(upstream, conn, moved)
            up.join(1.0)
        finally:
            upstream.close()
            if self._record:
                self._record({**facts, **moved})

    def _count(self, size: int) -> bool:
        """Count `size` more bytes moved by the box; False once it is over its cap (said once)."""
        with self._lock:
            self.moved += size
            over = self.moved > MAX_BYTES and not self._over
            self._over = self._over or over
        if over:
            self._say(f"egress stopped: the box moved more than {MAX_BYTES} bytes")
        return not self._over

    def _splice(self, source: socket.socket, sink: socket.socket, moved: dict[str, int]) -> None:
        """From the outside back to the box, in the kernel (splice through a pipe): the bulk of the bytes go this way."""
        pipe_r, pipe_w = os.pipe()
        try:
            fcntl.fcntl(pipe_w, F_SETPIPE_SZ, SPLICE_CHUNK)
        except OSError:
            pass
        try:
            while True:
                size = os.splice(source.fileno(), pipe_w, SPLICE_CHUNK)
                if not size or not self._count(size):
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

    def _pump(self, source: IO[bytes], sink: socket.socket, moved: dict[str, int], way: str, length: int) -> None:
        left = length
        try:
            while left != 0:
                chunk = source.read1(CHUNK if left < 0 else min(CHUNK, left))  # type: ignore[attr-defined]
                if not chunk or not self._count(len(chunk)):
                    break
                sink.sendall(chunk)
                moved[way] += len(chunk)
                left -= len(chunk) if left > 0 else 0
        except (OSError, ValueError):
            pass
        if length < 0:  # a stream, not a request body: its end is passed on
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _read_head(reader: IO[bytes]) -> bytes:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline(HEAD_MAX)
        if not line:
            raise EOFError
        head += line
        if len(head) > HEAD_MAX:
            raise Refused("egress refused: request head too large", status=400)
    return head


def _exactly(reader: IO[bytes], size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _authority(text: str, default: int | None) -> tuple[str, int]:
    """(host, port) of `host:port`, `[v6]:port` or a bare host (with `default`)."""
    parsed = urllib.parse.urlsplit("//" + text.strip())
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.hostname is None or (port is None and default is None):
        raise Refused(f"egress refused: {text[:100]!r} is not HOST:PORT", status=400, socks=1)
    return parsed.hostname.lower().rstrip("."), port if port is not None else default  # type: ignore[return-value]
