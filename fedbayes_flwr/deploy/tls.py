"""The deployment's credentials: a private CA, a server certificate for the SuperLink's address,
and one ECDSA key pair per SuperNode (written with mode 0600).

With the ``cryptography`` package the certificates are made in Python, otherwise with the
``openssl`` command line, in the sequence of ``../shared/FLOWER_NOTES.md`` ("Deployment with TLS
and node authentication"); node keys come from ``ssh-keygen`` or ``cryptography``.

References
----------
Flower documentation, "Enable TLS connections" and "Authenticate SuperNodes".
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from fedbayes_flwr.errors import DeploymentError


class TLSFiles(NamedTuple):
    ca_cert: Path
    server_cert: Path
    server_key: Path


class NodeKey(NamedTuple):
    private: Path
    public: Path


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, readable by the owner only (mode 0600, set at creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def make_tls(directory: Path, host: str = "127.0.0.1", days: int = 2) -> TLSFiles:
    """A CA and a server certificate for ``host`` (its subjectAltName), ECDSA P-256, valid for
    ``days``: with the ``cryptography`` package when installed (Flower depends on it), else with
    the ``openssl`` command."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    if _have_cryptography():
        _tls_cryptography(files, host, days)
    else:
        _tls_openssl(files, host, days)
    return files


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _tls_cryptography(files: TLSFiles, host: str, days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedbayes-flwr local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_san(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca.public_bytes(pem))
    files.server_cert.write_bytes(cert.public_bytes(pem))
    write_private(files.server_key, key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _run_tool(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DeploymentError(f"{argv[0]} failed ({proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-500:]}")


def _tls_openssl(files: TLSFiles, host: str, days: int) -> None:
    if shutil.which("openssl") is None:
        raise DeploymentError("making certificates needs the 'cryptography' package or the "
                              "'openssl' command; neither is available")
    d = files.ca_cert.parent
    ec_args = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    kind = "IP" if _is_ip(host) else "DNS"
    (d / "san.cnf").write_text(f"subjectAltName={kind}:{host}\n")
    old = os.umask(0o077)
    try:
        _run_tool(["openssl", "req", "-x509", *ec_args, "-days", str(days), "-subj",
                   "/CN=fedbayes-flwr local CA", "-keyout", "ca.key", "-out", "ca.crt"], d)
        _run_tool(["openssl", "req", *ec_args, "-subj", f"/CN={host}", "-keyout", "server.key",
                   "-out", "server.csr"], d)
        _run_tool(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey",
                   "ca.key", "-CAcreateserial", "-days", str(days), "-extfile", "san.cnf",
                   "-out", "server.crt"], d)
    finally:
        os.umask(old)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def make_node_key(directory: Path, name: str) -> NodeKey:
    """An ECDSA P-384 key pair in OpenSSH format (what ``flower-supernode
    --auth-supernode-private-key`` and ``flwr supernode register`` read)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = NodeKey(directory / name, directory / f"{name}.pub")
    if _have_cryptography():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        private = ec.generate_private_key(ec.SECP384R1())
        write_private(key.private, private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption()))
        key.public.write_bytes(private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    else:
        _run_tool(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", name],
                  directory)
    return key
