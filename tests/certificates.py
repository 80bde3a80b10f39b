"""A test certificate authority and a server certificate from it: for HTTPS hosts the tests run on loopback or in containers."""

import datetime


def issue_certificates(here, name: str) -> tuple[str, str]:
    """A test authority (its certificate at here/ca.pem, for the host to trust) and a server certificate and key for `name`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test authority")])

    def issued(subject, public_key, ca: bool):
        builder = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
        builder = builder.serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        builder = builder.not_valid_after(now + datetime.timedelta(days=1)).add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    (here / "ca.pem").write_bytes(issued(ca_name, ca_key.public_key(), True).public_bytes(pem))
    leaf = issued(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key.public_key(), False)
    return leaf.public_bytes(pem).decode(), key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
