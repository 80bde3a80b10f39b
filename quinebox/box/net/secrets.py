"""Secrets a box may use but never hold: a placeholder in its environment, the real value only on the wire.

`secret:NAME@HOST[,HOST…]` gives the box `NAME=<placeholder>`. The box's
connections to those hosts are intercepted by the host's egress proxy with the
box's own certificate authority (made when the box is, its key only in this
process's memory, never shared between boxes); the box trusts it through a
bundle of its image's roots and that authority. In a request to a bound host,
the proxy puts the real `$NAME` of quinebox's own environment where the
placeholder is in the request's headers, and only when the TLS server name,
the Host header and the bound host agree. A placeholder in a request to any
other host is refused and recorded as an exfiltration attempt.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quinebox.errors import GrantError

if TYPE_CHECKING:
    import ssl

#: Where a box finds its authority and its bundle (a read-only bind mount of the host's copy).
TLS_DIR = "/run/quinebox/tls"
#: The image's own roots, wherever its distribution keeps them.
ROOTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
#: What names the bundle for each kind of client; NODE_EXTRA_CA_CERTS adds to node's own roots, so it gets the authority alone.
BUNDLE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "AWS_CA_BUNDLE")

_roots_cache: dict[str, bytes] = {}
_roots_lock = threading.Lock()


def placeholder(session: str, name: str) -> str:
    """What the box holds instead of `name`'s value: distinctive, and worthless anywhere but its bound hosts."""
    return f"quinebox-secret-{name}-{session}"


@dataclass(frozen=True)
class Secret:
    name: str
    hosts: tuple[str, ...]
    placeholder: str
    value: str


def secrets_for(session: str, granted: tuple[tuple[str, tuple[str, ...]], ...], environ: dict[str, str] | os._Environ) -> tuple[Secret, ...]:
    """The box's secrets with their real values from quinebox's environment; GrantError for one that is not set."""
    found = []
    for name, hosts in granted:
        if name not in environ:
            raise GrantError(f"cannot grant secret:{name}: {name} is not set in quinebox's environment; set it where quinebox runs")
        found.append(Secret(name, hosts, placeholder(session, name), environ[name]))
    return tuple(found)


class Authority:
    """One box's certificate authority, and a server certificate for each host it intercepts, made on demand."""

    def __init__(self, session: str):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._serialization, self._ec, self._oid = x509, hashes, serialization, ec, NameOID
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"quinebox box {session}")])
        self._name = name
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def pem(self) -> bytes:
        return self.certificate.public_bytes(self._serialization.Encoding.PEM)

    def context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for `host` signed by this authority."""
        with self._lock:
            if host not in self._contexts:
                self._contexts[host] = self._server_context(host)
            return self._contexts[host]

    def _server_context(self, host: str) -> ssl.SSLContext:
        import ssl

        x509, serialization = self._x509, self._serialization
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(self._oid.COMMON_NAME, host)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, self._hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Only a box that names the bound host in its TLS handshake gets this host's certificate.
        context.sni_callback = lambda _socket, name, _context: None if name == host else ssl.ALERT_DESCRIPTION_ACCESS_DENIED
        with tempfile.TemporaryDirectory() as private:  # load_cert_chain reads files; they live a moment, mode 0700
            chain, secret = os.path.join(private, "chain.pem"), os.path.join(private, "key.pem")
            with open(chain, "wb") as f:
                f.write(leaf.public_bytes(serialization.Encoding.PEM) + self.pem())
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
            context.load_cert_chain(chain, secret)
        return context


def image_roots(read: Callable[[str], bytes], image: str) -> bytes:
    """The image's own trusted roots (b"" when it has none), read once per image (`read(path)` raises when there is
    no regular file at `path`)."""
    with _roots_lock:
        if image in _roots_cache:
            return _roots_cache[image]
    found = b""
    for path in ROOTS:
        try:
            found = read(path)
        except Exception:  # noqa: BLE001 - not there (or not a file): try the next place
            continue
        if found:
            break
    with _roots_lock:
        _roots_cache[image] = found
    return found


def engine_reader(backend: Any, image: str) -> Callable[[str], bytes]:
    """A regular file of `image`, read through the engine."""
    import tarfile

    def read(path: str) -> bytes:
        with backend.archive(image, path) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            member = next(iter(tar), None)
            if member is None or not member.isfile():
                raise FileNotFoundError(path)
            extracted = tar.extractfile(member)
            if extracted is None:
                raise FileNotFoundError(path)
            return extracted.read()

    return read


def rootfs_reader(rootfs: str) -> Callable[[str], bytes]:
    """A regular file of an unpacked image, found beneath its root with no link followed (the image chose its links)."""
    from quinebox.worlds import beneath

    def read(path: str) -> bytes:
        root = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY)
        try:
            parent, name = beneath.open_parent(root, path.lstrip("/"))
            try:
                fd = beneath.open_file(parent, name)
            finally:
                os.close(parent)
            with os.fdopen(fd, "rb") as f:
                return f.read()
        finally:
            os.close(root)

    return read


def write_trust(directory: str, authority: Authority, roots: bytes) -> None:
    """`ca.pem` (the authority) and `bundle.pem` (the image's roots and the authority) for the box to read."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with open(os.path.join(directory, "ca.pem"), "wb") as f:
        f.write(authority.pem())
    with open(os.path.join(directory, "bundle.pem"), "wb") as f:
        f.write(roots.rstrip(b"\n") + b"\n" + authority.pem() if roots else authority.pem())


def prepare_secrets(
    session: str, granted: tuple[tuple[str, tuple[str, ...]], ...], tls_dir: str | None, read: Callable[[str], bytes], image: str
) -> tuple[tuple[Secret, ...], Authority | None]:
    """A box's secrets and its own authority, the box's trust written to `tls_dir`; nothing without secret grants."""
    if not granted or not tls_dir:
        return (), None
    secrets = secrets_for(session, granted, os.environ)
    authority = Authority(session)
    write_trust(tls_dir, authority, image_roots(read, image))
    return secrets, authority
