"""Client certificates (mutual TLS) from a connection's secret: what the ``tls`` part
may hold, the context built from it, and one connection runner against a TLS upstream
on loopback that requires a client certificate. No PEM text may show in a log line, a
reason or an exception's text."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import stat
import tempfile
import traceback
from typing import Any

import pytest
from websockets.asyncio.server import serve
from websockets.exceptions import InvalidMessage

from tests.support.timing import scaled
from tests.support.tls_upstream import (
    KEY_PASSWORD,
    Identity,
    Pki,
    TlsUpstream,
    make_pki,
    serving_tls,
)
from tests.unit.test_connection_runner import FakeStore, Recorder, wait_for
from tests.unit.test_runner_upstreams import REF, Secrets, logged, run, runner_for
from worker import upstream_link
from worker.connection_state import Ending
from worker.credentials import SecretError, parse_secret
from worker.upstream_failures import client_certificate_refused, describe, permanent_refusal

pytestmark = pytest.mark.timeout(30)

REFUSED = "upstream ended the TLS handshake (client certificate refused or missing)"


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


def tls(identity: Identity | None, pki: Pki, **more: str) -> dict[str, str]:
    """A secret's ``tls``: ``identity``'s certificate and key (none: no client
    certificate), the test CA to trust, and ``more``."""
    part = {"ca": pki.ca.cert}
    if identity is not None:
        part.update(cert=identity.cert, key=identity.key)
    return {**part, **more}


def pem_texts(pki: Pki) -> list[str]:
    """What must never show: every key, and the certificates too (a certificate is
    not a secret, but nothing of the value is shown, so none can leak by mistake)."""
    identities = (pki.client, pki.stranger, pki.other_client, pki.ca)
    return [
        line
        for identity in identities
        for text in (identity.cert, identity.key, identity.encrypted_key)
        for line in text.splitlines()
        if len(line) > 40  # the base64 body lines: the BEGIN/END lines are not secret
    ] + [KEY_PASSWORD]


def assert_nothing_of(pki: Pki, text: str) -> None:
    for secret in pem_texts(pki):
        assert secret not in text


def errors_text(error: BaseException) -> str:
    """An exception as a log formatter or a traceback would show it, causes included."""
    return "".join(traceback.format_exception(error)) + repr(error)


# --- the tls part of a secret -----------------------------------------------------------


def test_a_client_certificate_makes_a_context_that_still_verifies_the_server(pki):
    got = parse_secret(REF, json.dumps({"tls": tls(pki.client, pki), "account": "a-1"}))
    assert isinstance(got.tls, ssl.SSLContext)
    assert got.tls.verify_mode is ssl.CERT_REQUIRED
    assert got.tls.check_hostname
    assert got.tls.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert dict(got.fields) == {"account": "a-1"}  # tls is not a subscribe field
    # The CA is trusted besides the system's own, not instead of them.
    system = ssl.create_default_context().get_ca_certs()
    assert len(got.tls.get_ca_certs()) == len(system) + 1


def test_an_encrypted_key_with_its_password(pki):
    part = tls(pki.client, pki, key=pki.client.encrypted_key, password=KEY_PASSWORD)
    assert isinstance(parse_secret(REF, json.dumps({"tls": part})).tls, ssl.SSLContext)


def test_a_ca_alone_trusts_a_private_upstream_without_a_client_certificate(pki):
    got = parse_secret(REF, json.dumps({"tls": {"ca": pki.ca.cert}}))
    assert isinstance(got.tls, ssl.SSLContext)
    assert parse_secret(REF, "{}").tls is None


BAD_PEM = "-----BEGIN CERTIFICATE-----\nMIIBnot-base64-at-all\n-----END CERTIFICATE-----\n"
NOT_TLS = "secret tls is not an object of PEM strings: cert, key, password, ca"
BOTH = "secret tls needs both cert and key"
NOT_CERT = "secret tls.cert is not a PEM certificate"
NOT_KEY = "secret tls.key is not a PEM private key"
NOT_CA = "secret tls.ca is not PEM certificates"


def encrypted(p: Pki, **more: str) -> dict[str, str]:
    return {"cert": p.client.cert, "key": p.client.encrypted_key, **more}


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda p: "cert", NOT_TLS, id="not an object"),
        pytest.param(lambda p: {"cert": p.client.cert, "key": 5}, NOT_TLS, id="not strings"),
        pytest.param(lambda p: {"certificate": p.client.cert}, NOT_TLS, id="unknown field"),
        pytest.param(lambda p: {}, NOT_TLS, id="empty"),
        pytest.param(lambda p: {"cert": p.client.cert}, BOTH, id="cert without key"),
        pytest.param(lambda p: {"key": p.client.key}, BOTH, id="key without cert"),
        pytest.param(lambda p: {"cert": BAD_PEM, "key": p.client.key}, NOT_CERT, id="bad cert"),
        pytest.param(
            lambda p: {"cert": p.client.key, "key": p.client.key}, NOT_CERT, id="cert=key"
        ),
        pytest.param(
            lambda p: {"cert": p.client.cert, "key": p.client.cert}, NOT_KEY, id="key=cert"
        ),
        pytest.param(lambda p: {"cert": p.client.cert, "key": "k3y"}, NOT_KEY, id="key not PEM"),
        pytest.param(
            lambda p: {"cert": p.client.cert, "key": p.other_client.key},
            "secret tls.key does not match tls.cert",
            id="key of another certificate",
        ),
        pytest.param(
            encrypted,
            "secret tls.key is encrypted and tls.password is missing",
            id="encrypted key without password",
        ),
        pytest.param(
            lambda p: encrypted(p, password="nope"),
            "secret tls.key cannot be read with tls.password",
            id="wrong password",
        ),
        pytest.param(lambda p: {"ca": BAD_PEM}, NOT_CA, id="ca not PEM"),
        pytest.param(lambda p: {"ca": p.client.key}, NOT_CA, id="ca is a key"),
        pytest.param(lambda p: {"ca": ""}, NOT_CA, id="ca empty"),
    ],
)
def test_a_tls_part_that_cannot_be_used_is_refused_with_a_reason_free_of_the_value(
    pki, make, reason
):
    with pytest.raises(SecretError) as refused:
        parse_secret(REF, json.dumps({"headers": {"X-Key": "v"}, "tls": make(pki)}))
    assert refused.value.reason == reason
    assert refused.value.reference == REF
    assert refused.value.__cause__ is None
    assert refused.value.__context__ is None or refused.value.__suppress_context__
    assert_nothing_of(pki, errors_text(refused.value))


def test_credentials_with_a_client_certificate_print_no_pem(pki):
    got = parse_secret(REF, json.dumps({"tls": tls(pki.client, pki), "headers": {"X-Key": "v"}}))
    shown = repr(got) + str(got) + repr(got.tls)
    assert_nothing_of(pki, shown)
    assert "tls" in shown


@pytest.fixture
def cert_files(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Each file ``load_cert_chain`` is given while a secret is parsed: (path, mode of
    the file, mode of its directory) as seen while it was read."""
    seen: list[tuple[str, int, int]] = []
    load = ssl.SSLContext.load_cert_chain

    def spy(self: ssl.SSLContext, certfile: str, *args: Any, **kwargs: Any) -> None:
        seen.append(
            (
                certfile,
                stat.S_IMODE(os.stat(certfile).st_mode),
                stat.S_IMODE(os.stat(os.path.dirname(certfile)).st_mode),
            )
        )
        load(self, certfile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    return seen


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux only")
def test_the_key_goes_through_an_anonymous_memory_file_closed_at_once(pki, cert_files):
    before = open_descriptors()
    for _ in range(3):
        parse_secret(REF, json.dumps({"tls": tls(pki.client, pki)}))
    ((path, mode, _), *_) = cert_files
    assert path.startswith("/proc/self/fd/")
    assert mode & 0o077 == 0
    assert open_descriptors() <= before  # closed: nothing of the key stays reachable


def test_without_memory_files_the_key_lives_in_a_private_directory_until_loaded(
    pki, cert_files, monkeypatch, tmp_path
):
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    got = parse_secret(REF, json.dumps({"tls": tls(pki.client, pki)}))
    assert isinstance(got.tls, ssl.SSLContext)
    ((path, mode, directory_mode),) = cert_files
    assert path.startswith(str(tmp_path))
    assert (mode, directory_mode) == (0o600, 0o700)
    assert list(tmp_path.iterdir()) == []  # the file and its directory are gone
    with pytest.raises(SecretError):
        parse_secret(REF, json.dumps({"tls": tls(pki.client, pki, key=pki.other_client.key)}))
    assert list(tmp_path.iterdir()) == []  # gone after a failed load too


# --- how a refused client certificate shows ---------------------------------------------


def alert_from_a_server(pki: Pki, client: Identity | None, version: ssl.TLSVersion) -> ssl.SSLError:
    """The error a client meets when the test server refuses its certificate (or its
    lack of one): a real handshake between two in-memory TLS objects, no socket."""
    server_context = TlsUpstream(pki, maximum_version=version).server_context()
    client_context = parse_secret(REF, json.dumps({"tls": tls(client, pki)})).tls
    assert client_context is not None
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = client_context.wrap_bio(client_in, client_out, server_hostname="localhost")
    theirs = server_context.wrap_bio(server_in, server_out, server_side=True)
    for _ in range(10):
        try:
            ours.do_handshake()
            ours.read()  # TLS 1.3: the server's verdict comes after the client's Finished
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as error:
            return error
        server_in.write(client_out.read())
        with contextlib.suppress(ssl.SSLError):  # the server refuses: its alert goes out
            theirs.do_handshake()
        client_in.write(server_out.read())
    raise AssertionError("the handshake was not refused")


@pytest.mark.parametrize(
    ("version", "client", "alert"),
    [
        (ssl.TLSVersion.TLSv1_2, "none", "SSLV3_ALERT_HANDSHAKE_FAILURE"),
        (ssl.TLSVersion.TLSv1_2, "stranger", "TLSV1_ALERT_UNKNOWN_CA"),
        (ssl.TLSVersion.TLSv1_3, "none", "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
        (ssl.TLSVersion.TLSv1_3, "stranger", "TLSV1_ALERT_UNKNOWN_CA"),
    ],
)
def test_a_servers_alert_refusing_the_certificate_is_told_apart(pki, version, client, alert):
    error = alert_from_a_server(pki, None if client == "none" else pki.stranger, version)
    assert error.reason == alert
    assert client_certificate_refused(error, with_tls=False)  # whatever the secret holds
    assert describe(error) == "TLS client certificate refused"
    assert permanent_refusal(error) is None  # the failing time decides


def alert(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, reason.lower())
    error.reason = reason  # as ssl sets it on the errors it raises
    return error


def closed_before_the_answer() -> InvalidMessage:
    """What websockets raises when the connection closes before the HTTP answer."""
    error = InvalidMessage("did not receive a valid HTTP response")
    error.__cause__ = EOFError("connection closed while reading HTTP status line")
    return error


def plain_http_1_0() -> InvalidMessage:
    error = InvalidMessage("did not receive a valid HTTP response")
    error.__cause__ = ValueError("unsupported protocol; expected HTTP/1.1: HTTP/1.0 403 Nope")
    return error


@pytest.mark.parametrize(
    ("error", "with_tls", "refused"),
    [
        (ConnectionResetError(), True, True),  # TLS 1.2 through asyncio: the alert is lost
        (ConnectionResetError(), False, False),
        (ssl.SSLEOFError(8, "EOF"), True, True),
        (closed_before_the_answer(), True, True),  # TLS 1.3: the alert is not seen
        (closed_before_the_answer(), False, False),
        (plain_http_1_0(), True, False),  # an answer: not a TLS refusal
        (alert("SSLV3_ALERT_CERTIFICATE_EXPIRED"), False, True),
        (alert("TLSV1_ALERT_PROTOCOL_VERSION"), True, False),
        (ssl.SSLError(1, "no reason set"), True, False),
        (ssl.SSLCertVerificationError(1, "the server's, not ours"), True, False),
        (TimeoutError(), True, False),
        (ConnectionRefusedError(), True, False),
        (None, True, False),
    ],
)
def test_what_counts_as_the_client_certificate_refused(error, with_tls, refused):
    assert client_certificate_refused(error, with_tls=with_tls) is refused


# --- one connection against an upstream that requires a client certificate ----------------


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Every exception an upstream connect of the runner raised."""
    seen: list[BaseException] = []
    open_ = upstream_link.UpstreamLink._open

    async def spy(self: upstream_link.UpstreamLink, url: str) -> Any:
        try:
            return await open_(self, url)
        except Exception as error:
            seen.append(error)
            raise

    monkeypatch.setattr(upstream_link.UpstreamLink, "_open", spy)
    return seen


def assert_nothing_leaked(
    pki: Pki, caplog: pytest.LogCaptureFixture, failures: list[BaseException], *also: str
) -> None:
    records = [
        logging.Formatter().formatException(r.exc_info) for r in caplog.records if r.exc_info
    ]
    text = logged(caplog) + "".join(records) + "".join(map(errors_text, failures))
    assert_nothing_of(pki, text + "".join(also))


async def test_a_connection_with_the_right_client_certificate_streams(pki, caplog, failures):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(tls=tls(pki.client, pki))
    async with serving_tls(TlsUpstream(pki)) as upstream:
        store, handler = FakeStore(), Recorder()
        runner = runner_for(store, handler, upstream.url, secret=REF, secrets=secrets)
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 20, scaled(10))
        runner.stop()
        outcome = await asyncio.wait_for(task, scaled(5))
    assert outcome.ending is Ending.SHUTDOWN
    assert handler.finished[:20] == list(range(1, 21))
    assert upstream.clients == ["device-1"]  # the server saw the secret's certificate
    assert secrets.reads == 1
    assert failures == []
    assert_nothing_leaked(pki, caplog, failures)


@pytest.mark.parametrize(
    "maximum_version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["TLS 1.2", "TLS 1.3"]
)
@pytest.mark.parametrize("client", ["none", "stranger"])
async def test_a_refused_or_missing_certificate_reads_the_secret_again_then_parks(
    pki, caplog, failures, maximum_version, client
):
    """Without a client certificate, or with one the server does not trust, the server
    ends the handshake. Each attempt reads the secret again once (a rotation) and
    tries again at once; refused again, the attempt fails as a secret that cannot be
    used does: retried with backoff, parked after UPSTREAM_FAIL_AFTER_SECONDS."""
    caplog.set_level(logging.DEBUG)
    identity = None if client == "none" else pki.stranger
    secrets = Secrets(tls=tls(identity, pki))
    upstream = TlsUpstream(pki, maximum_version=maximum_version)
    async with serving_tls(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store, handler, upstream.url, secret=REF, secrets=secrets, fail_after=0.6
        )
        outcome = await asyncio.wait_for(run(runner), scaled(10))
    assert outcome.ending is Ending.PARKED
    ((_, _, parked),) = store.parks
    assert parked == f"no message handled for 0.6 s: {REFUSED}"
    assert runner.health.last_error == REFUSED
    assert upstream.clients == []
    assert handler.finished == []
    attempts = len(failures)
    assert attempts >= 2  # retried with backoff
    # Each attempt reads the secret again once: the first read, then one per attempt
    # (the value read again stays cached for the next attempt's first try).
    assert secrets.reads == attempts + 1
    again = [r for r in caplog.records if "reading the secret again" in r.getMessage()]
    assert len(again) == attempts
    assert all(r.secret == REF for r in again)  # type: ignore[attr-defined]
    assert [str(f) for f in failures] == [REFUSED] * attempts
    assert_nothing_leaked(pki, caplog, failures, parked)


async def test_a_rotated_certificate_is_read_again_and_connects_in_the_same_attempt(
    pki, caplog, failures
):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(tls=tls(pki.stranger, pki))
    async with serving_tls(TlsUpstream(pki)) as upstream:
        store, handler = FakeStore(), Recorder()
        runner = runner_for(store, handler, upstream.url, secret=REF, secrets=secrets)
        cache = runner._s.secrets
        assert cache is not None
        await cache.get(REF)  # what other connections had read before the rotation
        secrets.values[REF] = json.dumps({"tls": tls(pki.client, pki)})
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 5, scaled(10))
        runner.stop()
        await asyncio.wait_for(task, scaled(5))
    assert upstream.clients == ["device-1"]
    assert secrets.reads == 2
    assert runner.health.reconnects == 0  # the retry was part of the same attempt
    assert failures == []
    assert_nothing_leaked(pki, caplog, failures)


async def test_a_secret_with_tls_on_a_ws_url_fails_attempts_until_the_connection_parks(
    pki, caplog, failures
):
    caplog.set_level(logging.DEBUG)
    reached: list[str] = []

    async def handler_(ws: Any) -> None:
        reached.append(ws.request.path)

    secrets = Secrets(tls=tls(pki.client, pki))
    async with serve(handler_, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store,
            handler,
            f"ws://127.0.0.1:{port}/devices",
            secret=REF,
            secrets=secrets,
            fail_after=0.4,
        )
        outcome = await asyncio.wait_for(run(runner), scaled(10))
    assert outcome.ending is Ending.PARKED
    ((_, _, parked),) = store.parks
    assert parked == "no message handled for 0.4 s: secret has tls: the upstream URL must be wss://"
    assert reached == []  # never connected in the clear
    assert_nothing_leaked(pki, caplog, failures, parked)


async def test_a_secret_with_a_bad_key_never_connects_and_parks(pki, caplog, failures):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(tls=tls(pki.client, pki, key=pki.other_client.key))
    async with serving_tls(TlsUpstream(pki)) as upstream:
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store, handler, upstream.url, secret=REF, secrets=secrets, fail_after=0.4
        )
        outcome = await asyncio.wait_for(run(runner), scaled(10))
    assert outcome.ending is Ending.PARKED
    ((_, _, parked),) = store.parks
    assert parked == "no message handled for 0.4 s: secret tls.key does not match tls.cert"
    assert upstream.clients == []
    not_usable = [r for r in caplog.records if r.getMessage() == "secret not usable"]
    assert not_usable
    assert_nothing_leaked(pki, caplog, failures, parked)
