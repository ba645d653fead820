"""One connection's link to its upstream: connect with resume, hand each upstream
connection to the message pump, reconnect with backoff, and give the upstream up
(park) when :mod:`worker.upstream_failures` says so.

It has the shape of python-websockets' own reconnecting client (``async for ws in
connect(...)``): open, hand the connection over, classify what ended it (websockets'
``process_exception``; here :class:`~worker.upstream_failures.FailingClock`), back
off, open again. It is not built on that iterator: each attempt needs a URL of its
own (the resume point moves with the checkpoint; a plug-in's ``resolve_url`` may ask a
service for it), credentials read for it (a rotated
secret is read again after a 401 or 403), a pacer slot per upstream host, and a
backoff that starts over only once a message was handled on a connection (not on
every open, or an upstream that accepts and then closes at once is hammered), with
jitter from the worker's own random source (the simulator replays it). So the loop
takes the consumer as a callable (:meth:`UpstreamLink.run`): what the consumer did
with a connection decides the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from worker.connection_settings import ConnectionSettings
from worker.connection_state import ConnectionState
from worker.credentials import NO_CREDENTIALS, WSS_ONLY, Credentials, SecretError
from worker.direct_frames import DirectFrameConnection
from worker.failing_mark import FailingMark
from worker.patient_connection import PatientConnection
from worker.upstream_failures import (
    TLS_REFUSED,
    Verdict,
    client_certificate_refused,
    describe,
    http_status,
)
from worker.upstream_health import UpstreamHealth
from worker.upstream_protocol import (
    ResolveUrlError,
    UpstreamProtocol,
    open_frames,
    resolve_url,
    run_attached,
    with_query,
)
from wsfleet import metric_names as m
from wsfleet.backoff import backoff_delays
from wsfleet.checkpoint_page import BACKING_OFF, CONNECTING, STREAMING
from wsfleet.lease_rules import Lease

log = logging.getLogger(__name__)


class UpstreamConnection(PatientConnection, DirectFrameConnection):
    """websockets' client connection with the keepalive that waits for a held-back
    reader (:mod:`worker.patient_connection`) and the direct reading of the common
    frame (:mod:`worker.direct_frames`)."""


AUTH_REFUSALS = frozenset((401, 403))
"""Handshake answers that read the connection's secret again and retry at once."""

_handshake_log = logging.getLogger("worker.upstream.handshake")
# websockets logs a handshake's headers at DEBUG: a connection with credentials logs
# through this logger, which never goes below INFO whatever LOG_LEVEL says.
_handshake_log.setLevel(logging.INFO)

Consumer = Callable[[ClientConnection], Awaitable[str | None]]
"""Reads one open upstream connection until it closes or must be left; why it left
the connection itself (None: it closed, or the connection is ending)."""


class UpstreamLink:
    def __init__(
        self,
        settings: ConnectionSettings,
        lease: Lease,
        protocol: UpstreamProtocol,
        state: ConnectionState,
        health: UpstreamHealth,
        failing: FailingMark,
    ) -> None:
        self._s = settings
        self._lease = lease
        self._protocol = protocol
        self._state = state
        self._health = health
        self._failing_mark = failing

    async def run(self, consume: Consumer) -> str | None:
        """Connect and hand each upstream connection to ``consume``, again and again,
        until the connection ends (None) or the upstream is given up on: the reason to
        park the connection then."""
        s = self._s
        delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
        health = self._health
        connection_id = self._lease.connection_id
        while not self._stop_requested():
            url = self._protocol.resume_url(self._lease.ws_url, self._state.checkpoint)
            delivered_before = self._state.checkpoint
            failure: Exception | None = None
            left_because: str | None = None
            health.status = CONNECTING
            await s.pacer.wait(url)  # cancelled by a stop like every other wait here
            try:
                ws, frames = await self._open(url)
                async with ws:
                    # Before anything is read: a subscribe that the upstream waits for.
                    for frame in frames:
                        await ws.send(frame)
                    health.status = STREAMING
                    log.info(
                        "upstream connected",
                        extra={
                            "connection_id": connection_id,
                            "from_seq": self._state.checkpoint + 1,
                        },
                    )
                    if getattr(self._protocol, "attached", None) is None:
                        # No hook: no task beside the pump (one per connection adds up).
                        left_because = await consume(ws)
                    else:
                        link = _Link(ws, self._state, s.wall_ms, connection_id, health)
                        hook = asyncio.create_task(_attached(self._protocol, link))
                        try:
                            left_because = await consume(ws)
                        finally:
                            hook.cancel()
                            await asyncio.gather(hook, return_exceptions=True)
                        left_because = left_because or link.recycled
            except Exception as error:
                failure = error
                log.warning(
                    "upstream connection failed",
                    extra={
                        "connection_id": connection_id,
                        **_failure_fields(error, with_secret=self._lease.auth_secret is not None),
                    },
                )
            if self._stop_requested():
                return None
            delivered = self._state.checkpoint > delivered_before
            health.attempt_ended(
                left_because or describe(failure, delivered=delivered), BACKING_OFF
            )
            park_in: float | None = None
            if delivered:
                delays = backoff_delays(initial=0.25, maximum=30.0, rng=s.rng.random)
            else:
                failed = self._failing_mark.clock.attempt_failed(failure, s.wall_ms())
                if failed.verdict is Verdict.PARK:
                    log.warning(
                        "upstream given up on: parking the connection",
                        extra={"connection_id": connection_id, "reason": failed.reason},
                    )
                    return failed.reason
                if failed.record:
                    await self._failing_mark.record()
                park_in = failed.park_in
            s.metrics.count(m.UPSTREAM_RECONNECTS)
            delay = next(delays)
            if park_in is not None:
                # The next attempt comes by the end of the failing time at the latest,
                # so a 30 s backoff does not stretch it.
                delay = min(delay, max(park_in, 0.05))
            await asyncio.sleep(delay)
        return None

    def _stop_requested(self) -> bool:
        # A method, not the attribute: other tasks change it while this one awaits.
        return self._state.stopping

    async def _open(self, url: str) -> tuple[ClientConnection, list[str]]:
        """Connect to ``url`` with the connection's credentials (from its secret, when
        it names one: headers in the handshake, query parameters in this attempt's
        URL only, the TLS context) and make the frames to send first. A handshake
        refused with 401 or 403, or a TLS handshake that the upstream ends (a client
        certificate refused or missing), reads the secret again and tries once more at
        once; refused again, the refusal stands: a 4xx is permanent, which parks, and
        the TLS one fails the attempt as a secret that cannot be used does."""
        reference = self._lease.auth_secret
        credentials = await self._credentials(reference)
        try:
            return await self._connect(url, credentials)
        except (InvalidStatus, InvalidMessage, OSError) as refused:
            status = http_status(refused)  # HTTP/1.1 or a plain server's 1.0
            if (
                reference is None
                or self._s.secrets is None
                or not (status in AUTH_REFUSALS or _tls_refused(refused, credentials))
            ):
                raise
            log.warning(
                "upstream refused the credentials; reading the secret again",
                extra={
                    "connection_id": self._lease.connection_id,
                    "secret": reference,
                    "status": status,
                    "error": describe(refused),
                },
            )
            self._s.secrets.invalidate(reference, credentials)
            credentials = await self._credentials(reference)
            await self._s.pacer.wait(url)  # a mass rotation must not burst either
            try:
                return await self._connect(url, credentials)
            except (InvalidMessage, OSError) as again:
                if not _tls_refused(again, credentials):
                    raise
                # Said as the secret's problem: retried with backoff, not parked at once
                # (a fixed certificate is read at the next attempt).
                raise SecretError(reference, TLS_REFUSED) from None

    async def _credentials(self, reference: str | None) -> Credentials:
        if reference is None:
            return NO_CREDENTIALS
        if self._s.secrets is None:
            raise SecretError(reference, "no secret store configured")
        try:
            async with asyncio.timeout(self._s.open_timeout):
                return await self._s.secrets.get(reference)
        except SecretError as error:
            log.warning(
                "secret not usable",
                extra={
                    "connection_id": self._lease.connection_id,
                    "secret": reference,
                    "reason": error.reason,
                },
            )
            raise

    async def _connect(
        self, url: str, credentials: Credentials
    ) -> tuple[ClientConnection, list[str]]:
        s = self._s
        frames = open_frames(self._protocol, self._state.checkpoint, credentials.fields)
        target = await self._resolve(url, credentials)
        tls: dict[str, Any] = {}  # ssl=None would refuse wss://: the key is left out
        if credentials.tls is not None:
            if urlsplit(target).scheme != "wss":
                # The secret's TLS is not dropped quietly for a URL in the clear.
                raise SecretError(self._lease.auth_secret or "", WSS_ONLY)
            tls["ssl"] = credentials.tls
        ws = await connect(
            with_query(target, credentials.query),
            additional_headers=dict(credentials.headers) or None,
            **tls,
            open_timeout=s.open_timeout,
            ping_interval=s.ping_interval,
            ping_timeout=s.ping_timeout,
            close_timeout=1.0,
            max_size=s.max_message_bytes,
            create_connection=UpstreamConnection,
            logger=None if credentials is NO_CREDENTIALS else _handshake_log,
        )
        return ws, frames

    async def _resolve(self, url: str, credentials: Credentials) -> str:
        """The protocol's ``resolve_url`` step, bounded as a connect is; before every
        connect, since what a service hands out may be good for one connect only."""
        if getattr(self._protocol, "resolve_url", None) is None:
            return url  # no step: no timer either, the connect goes as before
        try:
            async with asyncio.timeout(self._s.open_timeout):
                return await resolve_url(
                    self._protocol, url, self._state.checkpoint, credentials.fields
                )
        except TimeoutError:
            raise ResolveUrlError("resolve_url timed out") from None


def _tls_refused(error: BaseException, credentials: Credentials) -> bool:
    return client_certificate_refused(error, with_tls=credentials.tls is not None)


class _Link:
    """The :class:`~worker.upstream_protocol.LinkPort` of one open upstream connection."""

    def __init__(
        self,
        ws: ClientConnection,
        state: ConnectionState,
        wall_ms: Callable[[], int],
        connection_id: str,
        health: UpstreamHealth,
    ) -> None:
        self._ws = ws
        self._health = health
        self._state = state
        self._loop = asyncio.get_running_loop()
        self.wall_ms = wall_ms
        self.connection_id = connection_id
        self.recycled: str | None = None
        """Why the hook left the connection, if it did."""

    def now(self) -> float:
        return self._loop.time()

    async def send(self, data: str) -> bool:
        if not self._state.may_handle(self._loop.time()):
            return False  # past the fence: a superseded owner sends nothing
        await self._ws.send(data)
        return True

    def keepalive_sent(self) -> None:
        self._health.keepalive_sent_ms = self.wall_ms()

    def keepalive_answered(self) -> None:
        self._health.keepalive_answered_ms = self.wall_ms()

    async def recycle(self, reason: str) -> None:
        self.recycled = reason
        log.warning(
            "leaving the upstream connection",
            extra={"connection_id": self.connection_id, "reason": reason},
        )
        await self._ws.close(1000, reason[:100])


async def _attached(protocol: UpstreamProtocol, link: _Link) -> None:
    """The protocol's hook for this connection; its failure is logged, and costs the
    hook only (the stream goes on)."""
    try:
        await run_attached(protocol, link)
    except (ConnectionClosed, asyncio.CancelledError):
        raise
    except Exception:
        log.exception(
            "the protocol's attached hook failed", extra={"connection_id": link.connection_id}
        )


def _failure_fields(error: Exception, *, with_secret: bool) -> dict[str, str]:
    """How a failed upstream connection is logged: the error's repr, or, for a
    connection with credentials (whose URL may carry some, and an exception's text may
    quote the URL), its short description and class only."""
    if with_secret:
        return {"error": describe(error), "error_class": type(error).__name__}
    return {"error": repr(error)}
