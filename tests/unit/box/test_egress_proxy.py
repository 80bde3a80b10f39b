"""The host's egress proxy with real sockets: HTTP CONNECT, absolute-form requests and SOCKS5 to real servers on loopback.

The box's side of each connection is one end of a socket pair, as the guest's
forwarder would hand it over; the outside world is servers on 127.0.0.1, named
through a hosts override. Nothing here goes anywhere but loopback: a refused
address is refused before any connection is tried. The rules are made with
parse_rule, so net:127.0.0.1 reaches those servers: no user can hold that rule
(Grants.parse refuses it; users reach the host's loopback as host-loopback).
"""

import http.server
import os
import socket
import socketserver
import threading
import time

import pytest
from proxied_box import ProxiedBox

from quinebox.audit.log import AuditLog, verify
from quinebox.netrules import parse_rule

BODY = os.urandom(50000)
LOOPBACK = "127.0.0.1 is the host's loopback, which no name or address reaches; for port {web} there grant net:host-loopback:{web} and connect to host-loopback:{web}"


class Files(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self):
        Files.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("X-Host-Seen", self.headers.get("Host", ""))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    for server in (web, echo):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    hosts = tmp_path_factory.mktemp("hosts") / "hosts"
    hosts.write_text("127.0.0.1 files.test echo.test\n169.254.169.254 meta.test\n10.9.9.9 private.test\n")
    old = os.environ.get("QUINEBOX_EGRESS_HOSTS")
    os.environ["QUINEBOX_EGRESS_HOSTS"] = str(hosts)
    yield web.server_address[1], echo.server_address[1]
    if old is None:
        del os.environ["QUINEBOX_EGRESS_HOSTS"]
    for server in (web, echo):
        server.shutdown()


class Box(ProxiedBox):
    def __init__(self, *grants: str, **options):
        super().__init__(frozenset(parse_rule(g, g[4:] or None) for g in grants), **options)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def http_get(sock: socket.socket, host: str, target: str = "/x") -> bytes:
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    return read_all(sock)


def test_connect_to_a_granted_address_tunnels_exact_bytes(servers):
    web, _ = servers
    box = Box("net:127.0.0.1")
    sock = box.connect()
    sock.sendall(f"CONNECT files.test:{web} HTTP/1.1\r\nHost: files.test:{web}\r\n\r\n".encode())
    assert sock.recv(1024) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert http_get(sock, "files.test").endswith(b"\r\n\r\n" + BODY)
    sock.close()
    deadline = time.monotonic() + 5
    while not box.records and time.monotonic() < deadline:
        time.sleep(0.05)
    [record] = box.records
    assert record["allowed"] and record["address"] == "127.0.0.1" and record["rule"] == "net:127.0.0.1" and record["down"] > len(BODY)


@pytest.mark.parametrize(
    "grants, target, words",
    [
        (("net:files.test",), "files.test:{web}", LOOPBACK),
        (("net",), "meta.test:80", "169.254.169.254 is a private or special address; only a net:CIDR grant reaches it (grant net:169.254.169.254:80)"),
        (("net",), "[::ffff:169.254.169.254]:80", "169.254.169.254 is a private or special address"),
        (("net:files.test",), "127.0.0.1:{web}", LOOPBACK),
        (("net:127.0.0.1:1",), "files.test:{web}", LOOPBACK),
        (("net:host-loopback:{web}",), "files.test:{web}", LOOPBACK),  # a name for loopback, whatever port is granted
        (("net:host-loopback:{web}",), "127.0.0.1:{web}", LOOPBACK),  # and the literal: only the name host-loopback
        (("net:host-loopback:1",), "host-loopback:{web}", "grant net:host-loopback:{web}"),
        (("net:other.test",), "private.test:443", "10.9.9.9 is a private or special address"),
        ((), "files.test:{web}", LOOPBACK),
    ],
)
def test_a_refused_connect_is_a_403_naming_the_grant_at_once(servers, grants, target, words):
    web, _ = servers
    box = Box(*(g.format(web=web) for g in grants))
    sock = box.connect()
    began = time.monotonic()
    target = target.format(web=web)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    answer = read_all(sock)
    assert time.monotonic() - began < 2
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert words.format(web=web).encode() in answer
    assert len(box.said) == 1 and box.said[0].startswith("egress to ") and words.format(web=web) in box.said[0]
    assert box.records == [{"allowed": False, "why": box.said[0], "destination": target}]


def test_a_plain_http_request_is_forwarded_once_with_its_host_checked(servers):
    web, _ = servers
    box = Box("net:127.0.0.0/8")
    answer = http_get(box.connect(), f"files.test:{web}", f"http://files.test:{web}/x")
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(BODY)
    assert f"X-Host-Seen: files.test:{web}".encode() in answer
    mismatch = http_get(box.connect(), "meta.test", f"http://files.test:{web}/x")
    assert mismatch.startswith(b"HTTP/1.1 400 Bad Request") and b"its Host header names meta.test" in mismatch
    https = http_get(box.connect(), "files.test", "https://files.test/x")
    assert https.startswith(b"HTTP/1.1 400") and b"https goes through CONNECT" in https


def test_a_connect_whose_host_header_names_another_host_is_refused(servers):
    web, _ = servers
    sock = Box("net:127.0.0.1").connect()
    sock.sendall(f"CONNECT files.test:{web} HTTP/1.1\r\nHost: meta.test:80\r\n\r\n".encode())
    assert read_all(sock).startswith(b"HTTP/1.1 400")


def socks(sock: socket.socket, host: str, port: int) -> bytes:
    sock.sendall(b"\x05\x01\x00")
    assert sock.recv(2) == b"\x05\x00"
    sock.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + port.to_bytes(2, "big"))
    return sock.recv(10)


def test_socks5_connects_a_granted_name_and_refuses_the_rest(servers):
    _, echo = servers
    box = Box("net:127.0.0.1")
    sock = box.connect()
    assert socks(sock, "echo.test", echo) == b"\x05\x00\x00\x01" + bytes(6)
    sock.sendall(b"ping over socks")
    assert sock.recv(100) == b"ping over socks"
    refused = Box("net:echo.test").connect()
    assert socks(refused, "echo.test", echo)[:2] == b"\x05\x02"
    assert read_all(refused) == b""


def test_a_thousand_refusals_leave_threads_and_memory_flat(servers):
    web, _ = servers
    box = Box("net:other.test")

    def refuse(count):
        for _ in range(count):
            sock = box.connect()
            sock.sendall(f"CONNECT files.test:{web} HTTP/1.1\r\n\r\n".encode())
            assert read_all(sock).startswith(b"HTTP/1.1 403")
            sock.close()

    def rss_kb():
        return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1])

    refuse(100)
    time.sleep(0.2)
    threads, rss = threading.active_count(), rss_kb()
    refuse(1000)
    time.sleep(0.5)
    assert threading.active_count() <= threads + 2
    assert rss_kb() - rss < 4096


def test_a_request_pipelined_after_the_first_is_never_forwarded(servers):
    web, _ = servers
    box = Box("net:127.0.0.0/8")
    sock = box.connect()
    Files.paths.clear()
    first = f"GET http://files.test:{web}/first HTTP/1.1\r\nHost: files.test:{web}\r\n\r\n"
    smuggled = f"GET /second HTTP/1.1\r\nHost: files.test:{web}\r\n\r\nCONNECT meta.test:80 HTTP/1.1\r\n\r\n"
    sock.sendall((first + smuggled).encode())
    answer = read_all(sock)
    assert answer.count(b"HTTP/1.") == 1 and answer.endswith(BODY)
    assert Files.paths == ["/first"]


def hand_over(path: str, fd: int) -> None:
    with socket.socket(socket.AF_UNIX) as egress:
        egress.connect(path)
        socket.send_fds(egress, [b"c"], [fd])


def test_the_box_hands_over_the_socket_it_accepted_and_the_host_serves_it(servers, tmp_path):
    web, _ = servers
    box = Box("net:127.0.0.1")
    box.egress.listen(str(tmp_path / "egress.sock"))
    try:
        with socket.create_server(("127.0.0.1", 0)) as forwarder:
            client = socket.create_connection(forwarder.getsockname())
            accepted, _ = forwarder.accept()
            hand_over(str(tmp_path / "egress.sock"), accepted.fileno())
            accepted.close()  # the box keeps nothing: the host holds the connection now
            client.settimeout(10)
            client.sendall(f"CONNECT files.test:{web} HTTP/1.1\r\n\r\n".encode())
            assert client.recv(39) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            assert http_get(client, "files.test").endswith(BODY)
    finally:
        box.egress.close()
    assert not (tmp_path / "egress.sock").exists()


def test_anything_but_a_tcp_socket_handed_over_is_closed_unread(servers, tmp_path):
    box = Box("net")
    box.egress.listen(str(tmp_path / "egress.sock"))
    try:
        pipe_r, pipe_w = os.pipe()
        unix_a, unix_b = socket.socketpair()
        for fd in (pipe_r, unix_a.fileno()):
            hand_over(str(tmp_path / "egress.sock"), fd)
        os.close(pipe_r)
        unix_a.close()
        time.sleep(0.3)
        unix_b.settimeout(2)
        assert unix_b.recv(10) == b""  # the host closed its copy and never answered
        os.close(pipe_w)
        with socket.socket(socket.AF_UNIX) as rude:  # no fd at all, then gone
            rude.connect(str(tmp_path / "egress.sock"))
            rude.sendall(b"garbage")
        assert box.said == [] and box.records == []
    finally:
        box.egress.close()


def test_a_box_holds_at_most_its_cap_of_connections_and_the_next_is_told_so(servers, monkeypatch):
    from quinebox.box.net import egress

    _, echo = servers
    monkeypatch.setattr(egress, "MAX_CONNECTIONS", 3)
    box = Box("net:127.0.0.1")
    held = []
    for _ in range(3):
        sock = box.connect()
        sock.sendall(f"CONNECT echo.test:{echo} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(39).startswith(b"HTTP/1.1 200")
        held.append(sock)
    extra = box.connect()
    assert read_all(extra).startswith(b"HTTP/1.1 503")
    held.pop().close()
    time.sleep(0.3)
    again = box.connect()
    again.sendall(f"CONNECT echo.test:{echo} HTTP/1.1\r\n\r\n".encode())
    assert again.recv(39).startswith(b"HTTP/1.1 200")  # a slot came back


def test_a_box_past_its_byte_cap_is_cut_off_and_told_once(servers, monkeypatch):
    web, _ = servers
    monkeypatch.setenv("QUINEBOX_EGRESS_MAX_BYTES", "20000")
    box = Box("net:127.0.0.1")
    sock = box.connect()
    sock.sendall(f"CONNECT files.test:{web} HTTP/1.1\r\n\r\n".encode())
    assert sock.recv(39).startswith(b"HTTP/1.1 200")
    got = http_get(sock, "files.test")
    assert len(got) < len(BODY)
    assert box.said == ["egress stopped: the box moved more than 20000 bytes"]


class Late(socketserver.BaseRequestHandler):
    """Answers at once, then holds its side of the connection open a while before it closes it, as a slow server
    does: the box has what it asked for, and may end, before its connection does."""

    def handle(self):
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        time.sleep(0.5)


def test_a_box_whose_connection_outlives_it_has_it_on_record_once_the_proxy_is_closed(servers):
    """The box ends (its side of the tunnel closed) while the far side still holds the connection: the proxy's
    close waits for it to end, so its record is there when the box's end is told (the process may exit next)."""
    late = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Late)
    threading.Thread(target=late.serve_forever, daemon=True).start()
    try:
        box = Box("net:127.0.0.1")
        sock = box.connect()
        sock.sendall(f"CONNECT 127.0.0.1:{late.server_address[1]} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(39) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok"):
            answer += sock.recv(100)
        sock.close()  # the box is gone; the server is not done with the connection
        box.egress.close()
        [record] = box.records
        assert record["allowed"] and record["up"] > 0 and record["down"] == len(answer)
    finally:
        late.shutdown()
        late.server_close()


def audited(kind: str) -> list[dict]:
    return [r["facts"] for r in AuditLog().records() if r["kind"] == kind]


def test_host_loopback_reaches_one_port_of_the_hosts_loopback_by_that_name_alone(servers, tmp_path, monkeypatch):
    web, echo = servers
    hosts = tmp_path / "hosts"  # a hosts override cannot point host-loopback elsewhere: the name is never looked up
    hosts.write_text("10.9.9.9 host-loopback\n127.0.0.1 files.test\n")
    monkeypatch.setenv("QUINEBOX_EGRESS_HOSTS", str(hosts))
    session = f"loopback-{os.getpid()}-{time.monotonic_ns()}"
    box = Box(f"net:host-loopback:{web}", session=session)
    assert audited("host_loopback_granted")[-1] == {"grants": [f"net:host-loopback:{web}"]}
    sock = box.connect()
    sock.sendall(f"CONNECT host-loopback:{web} HTTP/1.1\r\n\r\n".encode())
    assert sock.recv(39) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert http_get(sock, f"host-loopback:{web}").endswith(BODY)
    sock.close()
    answer = http_get(box.connect(), f"host-loopback:{web}", f"http://host-loopback:{web}/x")  # plain HTTP, as curl sends it
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(BODY)
    assert socks(box.connect(), "host-loopback", echo)[:2] == b"\x05\x02"  # another port of the loopback: refused
    deadline = time.monotonic() + 5
    def used():
        return [r["facts"] for r in AuditLog().records() if r["session"] == session and r["kind"] == "egress" and r["facts"]["allowed"]]

    while len(used()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(u["host"], u["address"], u["rule"]) for u in used()] == [("host-loopback", "127.0.0.1", f"net:host-loopback:{web}")] * 2
    assert box.said == [f"egress to host-loopback:{echo} refused: grant net:host-loopback:{echo}"]


def test_each_refused_destination_is_said_and_audited_once_per_box(servers):
    web, _ = servers
    session = f"told-{os.getpid()}-{time.monotonic_ns()}"
    box = Box("net:other.test", session=session)
    for target in ["files.test:1", "files.test:1", "echo.test:2", "files.test:1", "[::1]:3"]:
        sock = box.connect()
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert read_all(sock).startswith(b"HTTP/1.1 403")
    loop = "is the host's loopback, which no name or address reaches"
    assert box.said == [
        f"egress to files.test:1 refused: 127.0.0.1 {loop}; for port 1 there grant net:host-loopback:1 and connect to host-loopback:1",
        f"egress to echo.test:2 refused: 127.0.0.1 {loop}; for port 2 there grant net:host-loopback:2 and connect to host-loopback:2",
        f"egress to [::1]:3 refused: ::1 {loop}; for port 3 there grant net:host-loopback:3 and connect to host-loopback:3",
    ]
    assert len(box.records) == 5  # the tape has every decision
    mine = [r for r in AuditLog().records() if r["session"] == session]
    assert [(r["kind"], r["facts"]["allowed"], r["facts"]["destination"], r["facts"]["why"]) for r in mine] == [("egress", False, line.split()[2], line) for line in box.said]
    assert verify().intact


def test_a_network_fault_is_said_as_failed_never_as_refused(servers):
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    box = Box(f"net:host-loopback:{port}", "net:nowhere.invalid")
    for target in [f"host-loopback:{port}", "nowhere.invalid:443"]:
        sock = box.connect()
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert read_all(sock).startswith(b"HTTP/1.1 502 Bad Gateway")
    assert box.said[0] == f"egress to host-loopback:{port} failed: [::1]:{port} did not accept (Connection refused)"
    assert box.said[1].startswith("egress to nowhere.invalid:443 failed: cannot resolve nowhere.invalid")


def test_past_its_cap_of_refusals_a_box_is_told_so_once_and_floods_neither_stderr_nor_the_log(servers, monkeypatch):
    from quinebox.box.net import egress

    monkeypatch.setattr(egress, "MAX_TOLD", 2)
    session = f"flood-{os.getpid()}-{time.monotonic_ns()}"
    box = Box("net:other.test", session=session)
    for port in range(1, 8):
        sock = box.connect()
        sock.sendall(f"CONNECT files.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert read_all(sock).startswith(b"HTTP/1.1 403")
    assert [line.split(" refused")[0] for line in box.said[:2]] == ["egress to files.test:1", "egress to files.test:2"]
    assert box.said[2:] == ["egress: more than 2 different connections refused or failed; the rest are neither said nor audited"]
    assert len([r for r in AuditLog().records() if r["session"] == session]) == 2 and len(box.records) == 7
