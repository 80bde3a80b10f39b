"""The host's egress proxy for one box: each connection the box makes is decided here, at the address it goes to.

The box has no network (mode `none`). The guest's forwarder accepts each
connection made to 127.0.0.1:3128 in the box and hands the accepted socket
itself to the host over the box's egress socket (SCM_RIGHTS); from then on the
host reads and writes it directly, so no byte is copied inside the box. This
end speaks HTTP proxying (CONNECT, and absolute-form `http://` requests) and
SOCKS5 on it. Everything is decided here, never in the box: the name is
resolved here (`QUINEBOX_EGRESS_HOSTS`, a file in /etc/hosts format, is read
first), every address is checked against the tree's deny and ask rules and
the box's `net` grants (audit/asks.py; an ask waits for a person), and the
connection goes to exactly the address checked, so a name that changes its
answer between check and use changes nothing. A plain-HTTP request's Host
header must name what its URL names; one request per connection, so nothing
can follow it unchecked. Refusals answer at once (403 with the grant that
would allow it; a SOCKS refusal). Each refused destination is one line on
stderr and one `egress` record (allowed false) on the audit log, once per box;
a network fault is said as "failed" and recorded with `fault`. The box's tape
records every decision. The host's loopback is reached only by the name
`host-loopback`, never resolved, at a port granted as net:host-loopback:PORT."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable
from io import BufferedReader
from typing import IO, Any

from quinebox.audit import log
from quinebox.audit.approvals import Decision
from quinebox.audit.asks import ASK, HOLD, Asks
from quinebox.box.net.handover import Handover
from quinebox.box.net.proxywire import Refused, answer, exactly, forward_head, host_port, parse_head, read_head, resolve, splice, swap
from quinebox.box.net.secrets import Authority, Secret
from quinebox.errors import QuineboxError
from quinebox.netrules import HOST_LOOPBACK, LOOPBACK_ADDRESSES, Address, NetRule, is_host_name

#: Connections one box may hold open at once, and bytes it may move in all.
MAX_CONNECTIONS = 48
CONNECT_TIMEOUT = 10.0
CHUNK = 1 << 16
#: Distinct refusals said and audited per box; past it one line says the rest go unlisted (a box cannot flood either).
MAX_TOLD = 256

Record = Callable[[dict[str, Any]], None]
#: Puts a request to a person: (kind, subject, facts) → their decision.
Approve = Callable[[str, str, dict[str, Any]], Decision]


#: How long a box's end waits for its connections still open to end, each then put on the audit log: the box's own
#: end closes its side of each, so they end within milliseconds unless the far side holds one open.
CLOSE_WAIT = 2.0


class Egress:
    """One box's connections to the outside: decided, made, relayed, counted and recorded."""

    def __init__(
        self,
        rules: frozenset[NetRule],
        *,
        say: Callable[[str], None],
        record: Record | None = None,
        session: str = "",
        secrets: tuple[Secret, ...] = (),
        authority: Authority | None = None,
        asks: Asks = Asks(),
        approve: Approve | None = None,
    ):
        self.rules = rules
        self.session = session
        self.asks = asks
        self._approve = approve
        self.secrets = secrets
        self.authority = authority
        self._handover: Handover | None = None
        self._say = say
        self._record = record
        self._lock = threading.Lock()
        self._open = 0
        self._none_open = threading.Condition(self._lock)
        self.moved = 0
        self.max_bytes = int(os.environ.get("QUINEBOX_EGRESS_MAX_BYTES", str(16 << 30)))
        self._over = False
        self._told: set[str] = set()
        if loopback := sorted(rule.format() for rule in rules if rule.kind == "loopback"):
            log.note("host_loopback_granted", session, grants=loopback)

    def listen(self, path: str, owner: tuple[int, int] | None = None) -> None:
        """Serve the connections the box's user (`owner`, host ids) hands over at `path` (bound into the box only)."""
        self._handover = Handover(path, self._serve, owner)

    def close(self) -> None:
        """No connection taken any more, and those still open given up to CLOSE_WAIT to end: each is put on the
        audit log as it ends (`_note`), which the box's end usually is, and this process may exit right after."""
        if self._handover is not None:
            self._handover.close()
            self._handover = None
        with self._none_open:
            self._none_open.wait_for(lambda: self._open == 0, CLOSE_WAIT)

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            self.handle(conn, reader)
        finally:
            reader.close()
            conn.close()

    def handle(self, conn: socket.socket, reader: BufferedReader) -> None:
        """One connection the box handed over, until it ends (the caller closes it)."""
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
            except QuineboxError as exc:  # quinebox could not decide (an approval not put or not recorded is none): refused, said and recorded
                self._refused(conn, Refused(f"egress refused: {exc}"), socks, error=exc)
                return
            if opened is not None:
                self._relay(conn, reader, *opened)
        except QuineboxError as exc:  # before ValueError: a GrantError is one, and is quinebox's to say, never the box's nonsense
            self._say(str(exc))
        except (OSError, ValueError, EOFError):
            pass  # the box went away, or spoke nonsense: nothing to answer
        finally:
            with self._lock:
                self._open -= not full
                self._none_open.notify_all()

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
        if name is not None and not is_host_name(name):
            raise Refused(f"egress to {host!r} refused: not a host name", status=400, socks=1)
        where = f"[{host}]:{port}" if literal and literal.version == 6 else f"{host}:{port}"
        # The host's loopback has one name, never looked up (no hosts file or resolver can point it elsewhere).
        addresses = [literal] if literal else list(LOOPBACK_ADDRESSES) if name == HOST_LOOPBACK else resolve(host, port)
        why, fault = f"{host} has no address", True
        approved: str | None = None  # one person's answer serves every address of the name
        for address in addresses:
            rule, why, asked = self._decide(host, name, address, port, approved)
            if rule is None:
                fault = False
                continue
            approved = rule if asked else approved
            upstream = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            upstream.settimeout(CONNECT_TIMEOUT)
            try:
                upstream.connect((str(address), port))
            except OSError as exc:
                upstream.close()
                shown = f"[{address}]" if address.version == 6 else str(address)
                why, fault = f"{shown}:{port} did not accept ({exc.strerror or exc})", True
                continue
            upstream.settimeout(None)
            return upstream, {"host": host, "port": port, "address": str(address), "allowed": True, "rule": rule}
        if fault:
            raise Refused(f"egress to {where} failed: {why}", status=502, socks=5, destination=where, fault=True)
        raise Refused(f"egress to {where} refused: {why}", destination=where)

    def _decide(self, host: str, name: str | None, address: Address, port: int, approved: str | None) -> tuple[str | None, str, bool]:
        """(what allows connecting: the grant, or a person's approval; or None, and why not; whether a person was asked)."""
        outcome, rule = self.asks.egress(self.rules, name, address, port)
        if outcome == HOLD:
            return rule, "", False
        if outcome != ASK:
            return None, rule, False
        if approved is not None:
            return approved, "", True
        if self._approve is None:
            return None, f"it needs a person's approval ({rule}) and nobody can be asked here", True
        target = f"[{address}]" if name is None and address.version == 6 else host
        decision = self._approve("egress", f"net:{target}:{port}", {"host": host, "address": str(address), "port": port})
        if not decision.allowed:
            return None, f"not approved ({rule}; decided by {decision.by})", True
        return f"{rule} approved {decision.scope} by {decision.by}", "", True

    def _note(self, facts: dict[str, Any]) -> None:
        """A connection's end or refusal: on the audit log (a secret's name and host, never its value) and the box's tape."""
        log.note("egress", self.session, **facts)
        for name in facts.get("secrets") or ():
            log.note("secret_substituted", self.session, name=name, host=facts.get("host"))
        if self._record:
            self._record(facts)

    # -- HTTP proxying --------------------------------------------------------------------------

    def _http(self, conn: socket.socket, reader: IO[bytes]) -> tuple[socket.socket, dict[str, Any], bytes, int] | None:
        head = read_head(reader)
        method, target, version, headers, fields = parse_head(head)
        if method == "CONNECT":
            host, port = host_port(target, None)
            if "host" in fields and host_port(fields["host"], port) != (host, port):
                raise Refused(f"egress refused: CONNECT asks for {target} but its Host header names {fields['host']}", status=400)
            upstream, facts = self._connect(host, port)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if self.authority is not None and any(host in secret.hosts for secret in self.secrets):
                self._intercept(conn, upstream, host, port, facts)
                return None
            return upstream, facts, b"", -1
        url = urllib.parse.urlsplit(target)
        if url.scheme != "http" or not url.netloc:
            raise Refused(f"egress refused: {target[:100]!r} is not an http:// URL (https goes through CONNECT)", status=400)
        host, port = host_port(url.netloc, 80)
        if "host" in fields and host_port(fields["host"], 80) != (host, port):
            raise Refused(f"egress refused: the request is for {url.netloc} but its Host header names {fields['host']}", status=400)
        if "transfer-encoding" in fields:
            raise Refused("egress refused: a request body must have a Content-Length here", status=411)
        self._placeholders(head, host, port, plain=True)
        length = int(fields.get("content-length") or 0)
        upstream, facts = self._connect(host, port)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        return upstream, facts, forward_head(method, path, version, url.netloc, headers), length

    # -- secrets ----------------------------------------------------------------------------------

    def _placeholders(self, head: bytes, host: str, port: int, *, plain: bool = False) -> list[str]:
        """The secrets whose placeholders `head` carries to `host`; Refused for one that does not go there."""
        used = []
        for secret in self.secrets:
            if secret.placeholder.encode() not in head:
                continue
            if host not in secret.hosts:
                raise Refused(
                    f"egress to {host}:{port} refused: the request carries the placeholder of secret {secret.name}, which goes only to "
                    f"{', '.join(secret.hosts)}: recorded as an exfiltration attempt", exfiltration=secret.name,
                )
            if plain:
                raise Refused(f"egress to {host}:{port} refused: secret {secret.name} goes only over HTTPS")
            used.append(secret.name)
        return used

    def _intercept(self, conn: socket.socket, upstream: socket.socket, host: str, port: int, facts: dict[str, Any]) -> None:
        """A tunnel to a host bound to a secret, opened with the box's own authority: one request, its placeholders
        replaced in its headers, when the TLS server name, the Host header and the bound host agree."""
        import ssl

        assert self.authority is not None
        try:
            box = self.authority.context(host).wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            upstream.close()
            self._refused(None, Refused(f"egress to {host}:{port} refused: the box's TLS handshake did not name {host} ({exc.__class__.__name__})"), False)
            return
        moved = {"up": 0, "down": 0}
        used: list[str] = []
        try:
            try:
                outside = ssl.create_default_context().wrap_socket(upstream, server_hostname=host)
            except (ssl.SSLError, OSError) as exc:
                raise Refused(f"egress to {host}:{port} refused: {host} failed TLS verification ({exc})", status=502) from None
            reader = box.makefile("rb")
            head = read_head(reader)
            method, target, version, headers, fields = parse_head(head)
            if host_port(fields.get("host", "?"), port) != (host, port):
                raise Refused(f"egress to {host}:{port} refused: the request's Host header names {fields.get('host')}, not {host}")
            used = self._placeholders(head, host, port)
            if "transfer-encoding" in fields:
                raise Refused("egress refused: a request body must have a Content-Length here", status=411)
            real = {secret.placeholder: secret.value for secret in self.secrets if secret.name in used}
            swapped = [[name, swap(value, real)] for name, value in headers]
            outside.sendall(forward_head(method, target, version, fields["host"], swapped))
            foreign = {s.placeholder.encode(): s.name for s in self.secrets if host not in s.hosts}
            self._pump(reader, outside, moved, int(fields.get("content-length") or 0), foreign, host)
            while data := outside.recv(CHUNK):
                if not self._count(len(data)):
                    break
                box.sendall(data)
                moved["down"] += len(data)
            outside.close()
        except Refused as exc:
            self._refused(box, exc, False)
        except (OSError, ValueError, EOFError):
            pass
        finally:
            upstream.close()
            box.close()
            if not moved["down"] == moved["up"] == 0:
                self._note({**facts, "secrets": used, **moved})

    # -- SOCKS5 -----------------------------------------------------------------------------------

    def _socks(self, conn: socket.socket, reader: IO[bytes]) -> tuple[socket.socket, dict[str, Any], bytes, int] | None:
        _, count = exactly(reader, 2)
        if 0 not in exactly(reader, count):
            conn.sendall(b"\x05\xff")
            return None
        conn.sendall(b"\x05\x00")
        _, command, _, kind = exactly(reader, 4)
        if kind == 1:
            host = str(ipaddress.IPv4Address(exactly(reader, 4)))
        elif kind == 4:
            host = str(ipaddress.IPv6Address(exactly(reader, 16)))
        elif kind == 3:
            host = exactly(reader, exactly(reader, 1)[0]).decode("ascii", "replace")
        else:
            raise Refused("egress refused: unknown SOCKS address type", socks=8)
        port = int.from_bytes(exactly(reader, 2), "big")
        if command != 1:
            raise Refused(f"egress to {host}:{port} refused: only SOCKS CONNECT is served", socks=7)
        upstream, facts = self._connect(host, port)
        conn.sendall(b"\x05\x00\x00\x01" + bytes(6))
        return upstream, facts, b"", -1

    # -- answering and relaying ---------------------------------------------------------------------

    def _refused(self, conn: socket.socket | None, exc: Refused, socks: bool, error: QuineboxError | None = None) -> None:
        """A refusal said, audited, on the box's tape and answered; `error`: quinebox's own failure it came from (its kind recorded)."""
        message = str(exc)
        facts: dict[str, Any] = {"allowed": False, "why": message}
        if error is not None:
            facts["error"] = error.kind.value
        if exc.destination:
            facts["destination"] = exc.destination
        if exc.exfiltration:
            facts["exfiltration"] = exc.exfiltration
        self._tell(message, exc, facts)
        if self._record:
            self._record(facts)
        if conn is not None:
            answer(conn, exc, socks)

    def _tell(self, message: str, exc: Refused, facts: dict[str, Any]) -> None:
        """A refusal on stderr and the audit log, once per box for each (an exfiltration attempt every time, in the log)."""
        with self._lock:
            first = message not in self._told and len(self._told) < MAX_TOLD
            full = not first and message not in self._told and len(self._told) == MAX_TOLD
            if first or full:
                self._told.add(message)
        facts = {**facts, "fault": True} if exc.fault else facts
        if first:
            self._say(message)
        elif full:
            self._say(f"egress: more than {MAX_TOLD} different connections refused or failed; the rest are neither said nor audited")
        if first or exc.exfiltration:
            log.note("egress", self.session, **facts)

    def _refuse_silently(self, conn: socket.socket, why: str) -> None:
        self._note({"allowed": False, "why": why})
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def _relay(self, conn: socket.socket, reader: IO[bytes], upstream: socket.socket, facts: dict[str, Any], first: bytes, length: int) -> None:
        """Both ways until either side ends; `length` >= 0: only that many bytes of request body go up."""
        moved = {"up": 0, "down": 0}
        try:
            if first:
                upstream.sendall(first)
            # A request body goes to `facts["host"]` in the clear: no placeholder may ride in it.
            watched = {s.placeholder.encode(): s.name for s in self.secrets} if length >= 0 else {}
            up = threading.Thread(target=self._pump, args=(reader, upstream, moved, length, watched, facts["host"]), daemon=True)
            up.start()
            splice(upstream, conn, moved, self._count)
            up.join(1.0)
        finally:
            upstream.close()
            self._note({**facts, **moved})

    def _count(self, size: int) -> bool:
        """Count `size` more bytes moved by the box; False once it is over its cap (said once)."""
        with self._lock:
            self.moved += size
            over = self.moved > self.max_bytes and not self._over
            self._over = self._over or over
        if over:
            self._say(f"egress stopped: the box moved more than {self.max_bytes} bytes")
        return not self._over

    def _pump(self, source: IO[bytes], sink: socket.socket, moved: dict[str, int], length: int, watched: dict[bytes, str], host: str) -> None:
        """From the box out: `length` bytes (-1: to the end); a placeholder in `watched` stops the copy before it passes, and is recorded."""
        left = length
        tail = b""
        try:
            while left != 0:
                chunk = source.read1(CHUNK if left < 0 else min(CHUNK, left))  # type: ignore[attr-defined]  # always a socket file opened "rb", buffered: it has read1
                if not chunk or not self._count(len(chunk)):
                    break
                if watched:
                    seen = tail + chunk
                    leaked = next((name for placeholder, name in watched.items() if placeholder in seen), None)
                    if leaked:
                        self._refused(None, Refused(f"egress to {host} cut: the request body carries the placeholder of secret {leaked}: "
                                                    "recorded as an exfiltration attempt", exfiltration=leaked), False)
                        sink.shutdown(socket.SHUT_RDWR)
                        break
                    tail = seen[-max(map(len, watched)) :]
                sink.sendall(chunk)
                moved["up"] += len(chunk)
                left -= len(chunk) if left > 0 else 0
        except (OSError, ValueError):
            pass
        if length < 0:  # a stream, not a request body: its end is passed on
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass
