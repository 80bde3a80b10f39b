"""quinebox's own failure while the egress proxy decides a connection is said, recorded and answered, never a silent drop.

A GrantError is a ValueError too, and the proxy once caught ValueError (a box that spoke nonsense: nothing to
answer) before QuineboxError: a failure of quinebox's while asking a person dropped the connection with no line, no
audit record and no answer. Real sockets: the box's end of a socket pair, an echo server on 127.0.0.1 as the outside.
"""

import socket
import socketserver
import threading

import pytest
from proxied_box import ProxiedBox

from quinebox.audit.asks import Asks
from quinebox.audit.log import AuditLog
from quinebox.errors import GrantError, StateError
from quinebox.grants import Grants
from quinebox.netrules import parse_rule


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(("error", "kind"), [(GrantError("bad grant 'net:x': remembered rule is malformed"), "bad_grant"),
                                             (StateError("cannot write the approvals: no space left"), "storage")])
@pytest.mark.parametrize("socks", [False, True], ids=["http", "socks"])
def test_a_failure_of_quinebox_while_asking_is_a_refusal_said_and_recorded(echo_port, error, kind, socks):
    asked = []

    def approve(what, subject, facts):
        asked.append(subject)
        raise error

    rule = parse_rule("net:127.0.0.1", "127.0.0.1")  # as the egress tests do: no user can hold it, a test's echo server is here
    session = f"egress-{kind}-{socks}"
    box = ProxiedBox(frozenset(), session=session, asks=Asks(ask=Grants(net=frozenset({rule}))), approve=approve)
    sock = box.connect()
    if socks:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + echo_port.to_bytes(2, "big"))
    else:
        sock.sendall(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\nHost: 127.0.0.1:{echo_port}\r\n\r\n".encode())
    answer = read_all(sock)
    sock.close()
    assert asked == [f"net:127.0.0.1:{echo_port}"]
    if socks:
        assert answer[:2] == b"\x05\x02"  # not allowed by the rules
    else:
        assert answer.startswith(b"HTTP/1.1 403 ")
    line = f"egress refused: {error}"
    assert box.said == [line]
    assert box.records == [{"allowed": False, "why": line, "error": kind}]
    audited = [r["facts"] for r in AuditLog().records() if r["session"] == session and r["kind"] == "egress"]
    assert audited == [{"allowed": False, "why": line, "error": kind}]
