"""Certificates for the tests of TLS: self-signed for 127.0.0.1, each its own CA."""

import datetime
import ipaddress


def self_signed(folder, name: str = "") -> tuple[str, str]:
    """A certificate for 127.0.0.1 that may sign (so it is also its own CA), and its
    key, as PEM files in ``folder`` (``name`` tells several apart)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}cert.pem", folder / f"{name}key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def ray_tls_on(monkeypatch, folder) -> tuple[str, str]:
    """Ray's TLS settings in this process's environment, as an operator sets them on
    every node (RAY_USE_TLS and the three files): the certificate and key made."""
    cert, key = self_signed(folder, "ray-")
    for name, value in (("RAY_USE_TLS", "1"), ("RAY_TLS_SERVER_CERT", cert),
                        ("RAY_TLS_SERVER_KEY", key), ("RAY_TLS_CA_CERT", cert)):
        monkeypatch.setenv(name, value)
    return cert, key
