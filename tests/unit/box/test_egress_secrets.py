"""Secrets on the wire: the proxy intercepts a bound host with the box's own authority and swaps the placeholder in.

A real TLS server on loopback (its certificate from a test authority that the
host trusts through SSL_CERT_FILE) answers with a digest of the Authorization
header it got, so the real value never travels back to the box's side.
"""

import datetime
import hashlib
import http.server
import os
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from proxied_box import ProxiedBox

from quinebox.audit.log import AuditLog
from quinebox.box.net.secrets import Authority, Secret, placeholder
from quinebox.netrules import parse_rule

REAL = "real-token-" + os.urandom(8).hex()


def issue(name: str, issuer_key, issuer_name, key, ca: bool):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Digest(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = hashlib.sha256(self.headers.get("Authorization", "").encode()).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    here = tmp_path_factory.mktemp("tls")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = issue("test authority", ca_key, None, ca_key, True)
    leaf = issue("api.test", ca_key, ca.subject, key, False)
    (here / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (here / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (here / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Digest)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(here / "leaf.pem", here / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (here / "hosts").write_text("127.0.0.1 api.test other.test\n")
    saved = {k: os.environ.get(k) for k in ("QUINEBOX_EGRESS_HOSTS", "SSL_CERT_FILE")}
    os.environ.update(QUINEBOX_EGRESS_HOSTS=str(here / "hosts"), SSL_CERT_FILE=str(here / "ca.pem"))
    yield server.server_address[1]
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.update({k: v})
    server.shutdown()


class Box(ProxiedBox):
    def __init__(self):
        self.authority = Authority("s1")
        self.secret = Secret("API_TOKEN", ("api.test",), placeholder("s1", "API_TOKEN"), REAL)
        rules = frozenset({parse_rule("net:127.0.0.1", "127.0.0.1")})
        super().__init__(rules, secrets=(self.secret,), authority=self.authority, session="s1")

    def tls(self, port: int, server_name: str = "api.test") -> ssl.SSLSocket:
        sock = self.connect()
        sock.sendall(f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
        assert sock.recv(39) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        trust = ssl.create_default_context(cadata=self.authority.pem().decode())
        return trust.wrap_socket(sock, server_hostname=server_name)


def answer(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_the_real_value_reaches_the_bound_host_and_never_comes_back_to_the_box(api):
    box = Box()
    tls = box.tls(api)
    tls.sendall(f"GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {box.secret.placeholder}\r\n\r\n".encode())
    reply = answer(tls)
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(hashlib.sha256(f"Bearer {REAL}".encode()).hexdigest().encode())
    assert REAL.encode() not in reply
    deadline = time.monotonic() + 5
    while not box.records and time.monotonic() < deadline:
        time.sleep(0.05)
    [record] = box.records
    assert record["allowed"] and record["secrets"] == ["API_TOKEN"] and REAL not in repr(record)
    audit = AuditLog()
    assert REAL.encode() not in audit.path.read_bytes()
    substituted = [r for r in audit.records() if r["kind"] == "secret_substituted" and r["session"] == "s1"]
    assert [r["facts"] for r in substituted][-1:] == [{"name": "API_TOKEN", "host": "api.test"}]


def test_a_host_header_other_than_the_bound_host_gets_no_secret(api):
    box = Box()
    tls = box.tls(api)
    tls.sendall(f"GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {box.secret.placeholder}\r\n\r\n".encode())
    reply = answer(tls)
    assert reply.startswith(b"HTTP/1.1 403") and b"Host header names other.test" in reply


def test_a_tls_server_name_other_than_the_bound_host_is_refused(api):
    with pytest.raises(ssl.SSLError):
        Box().tls(api, server_name="other.test")


def test_the_placeholder_sent_to_another_host_is_refused_as_exfiltration(api):
    box = Box()
    sock = box.connect()
    sock.sendall(f"GET http://other.test:{api}/ HTTP/1.1\r\nHost: other.test:{api}\r\nX-Leak: {box.secret.placeholder}\r\n\r\n".encode())
    reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 403") and b"exfiltration" in reply
    assert box.records[-1]["allowed"] is False and box.records[-1]["exfiltration"] == "API_TOKEN"


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def plain():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_a_placeholder_in_a_request_body_is_cut_off_before_it_passes(api, plain):
    box = Box()
    sock = box.connect()
    body = b"x" * 70000 + box.secret.placeholder.encode() + b"y" * 10
    try:
        sock.sendall(f"POST http://other.test:{plain}/ HTTP/1.1\r\nHost: other.test:{plain}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        answer(sock)
    except ConnectionResetError:
        pass  # cut off: what the box still had to send was never read
    deadline = time.monotonic() + 5
    while len(box.records) < 2 and time.monotonic() < deadline:  # the refusal, then the cut connection's own record
        time.sleep(0.05)
    assert [r["exfiltration"] for r in box.records if r.get("exfiltration")] == ["API_TOKEN"]
    assert any("the request body carries the placeholder of secret API_TOKEN" in line for line in box.said)
    [relayed] = [r for r in box.records if r.get("allowed")]
    assert relayed["up"] < len(body)  # the placeholder never went out whole
