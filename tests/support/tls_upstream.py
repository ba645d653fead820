"""A TLS upstream on loopback that requires a client certificate (mutual TLS, as IoT
brokers do), and the keys and certificates for it, made at test time.

:func:`make_pki` makes a test CA, a server certificate for ``127.0.0.1`` and
``localhost`` signed by it, a client certificate signed by it, and a stranger: a
client certificate signed by a CA the server does not know. :class:`TlsUpstream` sends
json-seq messages (``{"seq": n}``, resumed with ``from_seq`` in the URL) every
``message_every`` seconds, and records the common name of each client certificate it
accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

KEY_PASSWORD = "pw-s3cret"
"""The password of every :attr:`Identity.encrypted_key`."""


@dataclass(frozen=True)
class Identity:
    """A certificate (PEM) and its private key (PEM, PKCS#8), in the clear and
    encrypted with :data:`KEY_PASSWORD`."""

    cert: str
    key: str
    encrypted_key: str
    private_key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pki:
    ca: Identity
    server: Identity
    client: Identity
    """Signed by :attr:`ca`: the server accepts it."""
    stranger: Identity
    """Signed by another CA: the server refuses it."""
    other_client: Identity
    """Signed by :attr:`ca` too, with a key of its own (not :attr:`client`'s)."""


def make_pki() -> Pki:
    ca = _identity("Test upstream CA", ca=True)
    other_ca = _identity("Stranger CA", ca=True)
    server = _identity(
        "upstream",
        issuer=ca,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client = _identity("device-1", issuer=ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger = _identity("device-x", issuer=other_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other = _identity("device-2", issuer=ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return Pki(ca=ca, server=server, client=client, stranger=stranger, other_client=other)


def _identity(
    name: str,
    *,
    issuer: Identity | None = None,
    ca: bool = False,
    san: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> Identity:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name = (
        subject if issuer is None else x509.load_pem_x509_certificate(issuer.cert.encode()).subject
    )
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    cert = builder.sign(key if issuer is None else issuer.private_key, hashes.SHA256())
    pem_cert = cert.public_bytes(serialization.Encoding.PEM).decode()
    return Identity(pem_cert, _pem(key, None), _pem(key, KEY_PASSWORD.encode()), key)


def _pem(key: ec.EllipticCurvePrivateKey, password: bytes | None) -> str:
    encryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()


@dataclass
class TlsUpstream:
    pki: Pki
    maximum_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED
    message_every: float = 0.005
    url: str = ""
    clients: list[str] = field(default_factory=list)
    """The common name of the client certificate of each connection accepted."""

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.maximum_version = self.maximum_version
        context.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
        context.load_verify_locations(cadata=self.pki.ca.cert)
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "server.pem")
            with open(path, "w") as pem:
                pem.write(self.pki.server.cert + self.pki.server.key)
            context.load_cert_chain(path)
        return context

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        peer = ws.transport.get_extra_info("peercert") or {}
        names = [value for rdn in peer.get("subject", ()) for key, value in rdn]
        self.clients.append(names[0] if names else "")
        query = parse_qs(urlsplit(ws.request.path).query)
        seq = int(query.get("from_seq", ["1"])[0])
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(json.dumps({"seq": seq}))
                seq += 1
                await asyncio.sleep(self.message_every)


@contextlib.asynccontextmanager
async def serving_tls(upstream: TlsUpstream) -> AsyncIterator[TlsUpstream]:
    server = await serve(upstream.handler, "127.0.0.1", 0, ssl=upstream.server_context())
    port = server.sockets[0].getsockname()[1]
    upstream.url = f"wss://127.0.0.1:{port}/devices"
    try:
        yield upstream
    finally:
        server.close()
        await server.wait_closed()
