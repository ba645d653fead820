"""Credentials by reference, read at connect time (docs/DESIGN.md §4.4, "Credentials").

A connection whose item names a secret (``auth_secret``) connects with what that
Secrets Manager secret holds: a SecretString with a JSON object

    {"headers": {"X-API-Key": "..."}, "query": {"token": "..."}, "<field>": "...",
     "tls": {"cert": "<PEM>", "key": "<PEM>", "password": "...", "ca": "<PEM>"}}

``headers`` go into the WebSocket handshake, ``query`` parameters into the URL of
that attempt only, and other string fields fill ``${secret:<field>}`` placeholders of
a subscribe frame. ``tls`` makes the TLS context of a ``wss://`` connect: a client
certificate (``cert``, its chain after it, and ``key``, which ``password`` decrypts),
and CAs trusted for this upstream besides the system's (``ca``); every part optional
but ``cert`` and ``key`` go together. A value read is cached per reference for
``SECRET_CACHE_SECONDS`` and read again at once when the upstream refuses the
handshake with 401 or 403, or ends the TLS handshake (a rotated secret).

A secret's value never reaches a log line, an exception's text, the table or a
metric: errors carry the reference and the error's class or code only, and
:class:`Credentials` prints the names it holds, not the values.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

NOT_AN_OBJECT: Final = "secret is not a JSON object with headers/query"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP header name (RFC 9110 token)."""
_PARTS: Final = ("headers", "query")
_TLS: Final = "tls"
_TLS_FIELDS: Final = frozenset(("cert", "key", "password", "ca"))
NOT_TLS: Final = "secret tls is not an object of PEM strings: cert, key, password, ca"
WSS_ONLY: Final = "secret has tls: the upstream URL must be wss://"


class SecretError(Exception):
    """A secret cannot be read or used. ``reason`` is short and free of the value
    (it may end up as a connection's last error or parked reason); ``reference`` names
    the secret for the log."""

    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(reason)
        self.reference = reference
        self.reason = reason


@dataclass(frozen=True, slots=True, repr=False)
class Credentials:
    """What one connection attempt adds: handshake headers, URL parameters, and the
    fields a subscribe template may name."""

    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    """The context of a ``wss://`` connect, from the secret's ``tls`` (None: websockets'
    default one)."""

    def __repr__(self) -> str:
        # Names only: a Credentials that ends up in a log or a traceback shows no value.
        return (
            f"Credentials(headers={sorted(self.headers)}, query={sorted(self.query)}, "
            f"fields={sorted(self.fields)}, tls={self.tls is not None})"
        )


NO_CREDENTIALS: Final = Credentials()


def parse_secret(reference: str, text: str | None) -> Credentials:
    """The credentials in a SecretString (None: the secret has a binary value only).
    Raises :class:`SecretError` with :data:`NOT_AN_OBJECT` (or the name of a header
    that cannot be sent, or what is wrong with ``tls``) when it is not usable; never
    with the value. Blocking when the secret has ``tls`` (the system's CAs are read
    from disk)."""
    if text is None:
        raise SecretError(reference, NOT_AN_OBJECT)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise SecretError(reference, NOT_AN_OBJECT) from None
    if not isinstance(doc, dict):
        raise SecretError(reference, NOT_AN_OBJECT)
    parts: dict[str, dict[str, str]] = {}
    for part in _PARTS:
        raw = doc.get(part, {})
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            raise SecretError(reference, NOT_AN_OBJECT)
        parts[part] = raw
    for name, value in parts["headers"].items():
        if not _TOKEN.match(name) or any(c in value for c in "\r\n\0"):
            raise SecretError(reference, f"secret header {name[:64]!r} cannot be sent")
    fields = {k: v for k, v in doc.items() if k not in _PARTS and k != _TLS and isinstance(v, str)}
    tls = None if _TLS not in doc else tls_context(reference, doc[_TLS])
    return Credentials(headers=parts["headers"], query=parts["query"], fields=fields, tls=tls)


def tls_context(reference: str, part: object) -> ssl.SSLContext:
    """The client context a secret's ``tls`` makes: the default one (the server's
    certificate verified against the system's CAs, its host name checked), with
    ``ca`` trusted too, and ``cert`` and ``key`` presented when the server asks.
    Raises :class:`SecretError` saying which field is wrong, never with its value."""
    if (
        not isinstance(part, dict)
        or not part
        or not part.keys() <= _TLS_FIELDS
        or not all(isinstance(v, str) for v in part.values())
    ):
        raise SecretError(reference, NOT_TLS)
    if ("cert" in part) != ("key" in part):
        raise SecretError(reference, "secret tls needs both cert and key")
    context = ssl.create_default_context()
    if "ca" in part:
        try:
            context.load_verify_locations(cadata=part["ca"])
        except (ssl.SSLError, ValueError):
            raise SecretError(reference, "secret tls.ca is not PEM certificates") from None
    if "cert" in part:
        _load_client_certificate(
            reference, context, part["cert"], part["key"], part.get("password")
        )
    return context


class _NoPasswordError(Exception):
    """The key is encrypted and the secret has no password for it."""


def _load_client_certificate(
    reference: str, context: ssl.SSLContext, cert: str, key: str, password: str | None
) -> None:
    try:
        # Parsed in memory first, so that what load_cert_chain refuses is the key.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert)
    except (ssl.SSLError, ValueError):
        raise SecretError(reference, "secret tls.cert is not a PEM certificate") from None

    def no_password() -> str:
        # Without a callback OpenSSL would prompt on the terminal, and wait.
        raise _NoPasswordError

    try:
        with _pem_file(f"{cert}\n{key}\n") as path:
            context.load_cert_chain(path, password=no_password if password is None else password)
    except _NoPasswordError:
        reason = "secret tls.key is encrypted and tls.password is missing"
        raise SecretError(reference, reason) from None
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            reason = "secret tls.key does not match tls.cert"
        elif password is not None and "ENCRYPTED" in key:
            reason = "secret tls.key cannot be read with tls.password"
        else:
            reason = "secret tls.key is not a PEM private key"
        raise SecretError(reference, reason) from None


@contextlib.contextmanager
def _pem_file(text: str) -> Iterator[str]:
    """A path OpenSSL can read ``text`` from, gone when the block ends: ``ssl`` loads a
    certificate's key from a file only.

    On Linux, an anonymous memory file (``memfd_create``) opened through
    ``/proc/self/fd``: it has no name in any directory (unlike a file in ``/dev/shm``,
    which is in memory too but listed there for its lifetime), is never written to a
    disk, and is freed when its descriptor is closed. Elsewhere, a file of mode 0600
    in a fresh directory of mode 0700 that :func:`tempfile.mkdtemp` names at random,
    deleted with its directory at the end of the block."""
    data = text.encode()
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        try:
            fd = memfd_create("tls-client-key", os.MFD_CLOEXEC)
        except OSError:
            pass  # refused (a seccomp profile): the file below
        else:
            try:
                os.fchmod(fd, 0o600)  # opened by path: the owner only
                _write_all(fd, data)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)
            return
    directory = tempfile.mkdtemp(prefix="tls-")
    path = os.path.join(directory, "client.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(directory)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def secrets_manager_reader(client: Any) -> Callable[[str], str | None]:
    """``GetSecretValue`` with ``client`` (a boto3 Secrets Manager client): the
    SecretString of a reference (name or ARN), None for a binary secret. Errors become
    :class:`SecretError` with the error code (``ResourceNotFoundException``,
    ``AccessDeniedException``...) or class, never the text of the answer."""

    def read(reference: str) -> str | None:
        try:
            answer = client.get_secret_value(SecretId=reference)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code") or "ClientError")
            raise SecretError(reference, f"secret not readable: {code[:64]}") from None
        except BotoCoreError as error:
            raise SecretError(reference, f"secret not readable: {type(error).__name__}") from None
        value = answer.get("SecretString")
        return value if isinstance(value, str) else None

    return read


@dataclass(slots=True)
class _Entry:
    credentials: Credentials
    read_at: float


class SecretCache:
    """Credentials per reference, each read at most once per ``ttl`` seconds (0: read
    at every use). ``read`` is blocking (boto3): it runs on the loop's executor, one
    read per reference at a time however many connections wait for it."""

    def __init__(
        self,
        read: Callable[[str], str | None],
        *,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._ttl = ttl
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._reading: dict[str, asyncio.Future[Credentials]] = {}
        self.reads = 0
        """Reads made so far (for tests and logs)."""

    def cached(self, reference: str) -> Credentials | None:
        """The credentials held for ``reference`` while still fresh."""
        entry = self._entries.get(reference)
        if entry is None or self._clock() - entry.read_at >= self._ttl:
            return None
        return entry.credentials

    async def get(self, reference: str) -> Credentials:
        """The credentials of ``reference``: cached, or read now. Raises
        :class:`SecretError`."""
        fresh = self.cached(reference)
        if fresh is not None:
            return fresh
        reading = self._reading.get(reference)
        if reading is None:
            reading = asyncio.ensure_future(self._load(reference))
            self._reading[reference] = reading
            reading.add_done_callback(lambda done: self._read_done(reference, done))
        # Shielded: a connection that gives up waiting does not cancel the read the
        # others wait for.
        return await asyncio.shield(reading)

    def invalidate(self, reference: str, used: Credentials) -> bool:
        """The upstream refused ``used``: forget it, unless a newer read replaced it
        already (many connections refused at once cause one read, not many). True
        when it was forgotten."""
        entry = self._entries.get(reference)
        if entry is None or entry.credentials is not used:
            return False
        del self._entries[reference]
        return True

    async def _load(self, reference: str) -> Credentials:
        loop = asyncio.get_running_loop()
        self.reads += 1
        # Parsed on the executor too: a tls part reads the system's CAs from disk.
        credentials = await loop.run_in_executor(None, self._read_credentials, reference)
        now = self._clock()
        self._entries = {
            ref: entry for ref, entry in self._entries.items() if now - entry.read_at < self._ttl
        }
        if self._ttl > 0:
            self._entries[reference] = _Entry(credentials, now)
        return credentials

    def _read_credentials(self, reference: str) -> Credentials:
        return parse_secret(reference, self._read(reference))

    def _read_done(self, reference: str, done: asyncio.Future[Credentials]) -> None:
        if self._reading.get(reference) is done:
            del self._reading[reference]
        if not done.cancelled():
            done.exception()  # retrieved: its waiters have it, nobody else must log it
