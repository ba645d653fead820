"""When a failing upstream is given up on (parked), with no I/O and no clock.

Two rules (docs/DESIGN.md §4.4, "Parking"):

- a **permanent refusal** parks at once: the handshake answered with an HTTP 4xx other
  than 408 and 429, an invalid URI, a TLS certificate that does not verify. Retrying
  cannot change the answer;
- anything else is retried, but a streak of failed attempts with **no message
  handled** for ``fail_after`` parks too. The streak's start (``failing_since_ms``,
  epoch ms) lives on the item, so a move or a failover does not restart the clock.

:class:`FailingClock` is fed the wall time (epoch ms) of each failed attempt and of
each handled message, and answers what to do; the runner makes the writes it asks for.
Reasons are short and free of URLs, so no query string or credential ends up in the
table. :func:`client_certificate_refused` tells the link when a TLS handshake ended by
the upstream is worth reading the connection's secret again (a rotated certificate).
"""

from __future__ import annotations

import enum
import errno
import re
import socket
import ssl
from dataclasses import dataclass
from typing import Final

from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    InvalidURI,
)

from worker.credentials import SecretError
from worker.upstream_protocol import OpenFrameError, ResolveUrlError

RETRYABLE_4XX = frozenset((408, 429))
"""Request Timeout and Too Many Requests: the upstream may answer otherwise later."""


_HTTP_1_0_STATUS: Final = re.compile(r"expected HTTP/1\.1: HTTP/1\.0 ([1-5][0-9]{2})\b")
"""How websockets says it read an HTTP/1.0 status line (the cause of its
``InvalidMessage``): a plain server's refusal, read for its status code."""


def http_status(error: BaseException | None) -> int | None:
    """The status code the upstream answered the handshake with, in HTTP/1.1 or 1.0;
    None when it did not answer one."""
    if isinstance(error, InvalidStatus):
        return error.response.status_code
    if isinstance(error, InvalidMessage) and isinstance(error.__cause__, ValueError):
        found = _HTTP_1_0_STATUS.search(str(error.__cause__))
        if found:
            return int(found.group(1))
    return None


CERTIFICATE_ALERTS = frozenset(
    (
        "SSLV3_ALERT_HANDSHAKE_FAILURE",  # TLS 1.2: no certificate where one is required
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    )
)
"""TLS alerts from the server (``ssl.SSLError.reason``) that refuse the client's
certificate, or the lack of one."""

TLS_REFUSED: Final = "upstream ended the TLS handshake (client certificate refused or missing)"


def client_certificate_refused(error: BaseException | None, *, with_tls: bool) -> bool:
    """Whether the upstream refused the client certificate, or wanted one: a TLS alert
    of :data:`CERTIFICATE_ALERTS`; or, for a connect with the secret's TLS context
    (``with_tls``), the connection reset or closed before an HTTP answer. A TLS 1.3
    server checks the client's certificate after the client has finished its side
    of the handshake, so its alert arrives with the first read, and websockets reports
    only the close (an :class:`InvalidMessage` from an :class:`EOFError`)."""
    if _certificate_alert(error):
        return True
    if not with_tls:
        return False
    if isinstance(error, (ConnectionResetError, ssl.SSLEOFError)):
        return True
    return isinstance(error, InvalidMessage) and isinstance(error.__cause__, EOFError)


def _certificate_alert(error: BaseException | None) -> bool:
    # ssl sets ``reason`` on the errors it raises; one made otherwise may lack it.
    return isinstance(error, ssl.SSLError) and getattr(error, "reason", None) in CERTIFICATE_ALERTS


def permanent_refusal(error: BaseException | None) -> str | None:
    """The reason to park at once, or None when ``error`` may pass by itself."""
    status = http_status(error)
    if status is not None:
        if 400 <= status < 500 and status not in RETRYABLE_4XX:
            return f"HTTP {status} from upstream"
        return None
    if isinstance(error, InvalidURI):
        return "invalid upstream URI"
    if isinstance(error, ssl.SSLCertVerificationError):
        return "upstream TLS certificate not trusted"
    return None


def describe(error: BaseException | None, *, delivered: bool = False) -> str:
    """A short, readable name for what ended an upstream connection (``delivered``:
    messages were handled on it): never the URL, never an exception's own text (which
    may quote the URL or a host)."""
    if error is None:
        return "closed by upstream" if delivered else "closed before a message"
    if isinstance(error, (SecretError, OpenFrameError, ResolveUrlError)):
        return str(error)  # written to be shown: a reason, never a secret's value
    status = http_status(error)
    if status is not None:
        return f"HTTP {status}"
    if isinstance(error, ConnectionClosed):
        if error.rcvd is None:
            return "connection lost"
        return f"closed by upstream ({error.rcvd.code})"
    if isinstance(error, InvalidHandshake):
        return "invalid handshake"
    if isinstance(error, InvalidURI):
        return "invalid URI"
    if isinstance(error, ssl.SSLCertVerificationError):
        return "TLS certificate not trusted"
    if _certificate_alert(error):
        return "TLS client certificate refused"
    if isinstance(error, ssl.SSLError):
        return "TLS error"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host not found"
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, OSError) and error.errno is not None and error.errno in errno.errorcode:
        return f"network error {errno.errorcode[error.errno]}"
    return type(error).__name__


class Verdict(enum.Enum):
    RETRY = "retry"
    """Try again after the backoff (bounded by :attr:`AttemptFailed.park_in`)."""
    PARK = "park"


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    verdict: Verdict
    record: bool
    """The streak has just begun: write ``failing_since_ms`` (once per streak)."""
    reason: str | None = None
    """For :attr:`Verdict.PARK`: the ``parked_reason``."""
    park_in: float | None = None
    """For :attr:`Verdict.RETRY`: seconds until the streak runs out; the next attempt
    should come no later, so a long backoff does not stretch the failing time."""


@dataclass
class FailingClock:
    """One connection's failing streak, in epoch milliseconds.

    ``failing_since_ms``: the streak's start as the item had it when the lease was
    taken (None: not failing). ``on_item`` tracks whether the item carries a mark.
    """

    fail_after_ms: int
    failing_since_ms: int | None = None

    def __post_init__(self) -> None:
        self.on_item = self.failing_since_ms is not None

    def attempt_failed(self, error: BaseException | None, now_ms: int) -> AttemptFailed:
        """An attempt ended with no message handled during it (``error`` None: the
        upstream closed by itself)."""
        if self.failing_since_ms is None:
            self.failing_since_ms = now_ms
        # Not yet on the item (the streak has just begun, or its write failed): write
        # it. A healthy connection never gets here, so it pays nothing.
        record = not self.on_item
        permanent = permanent_refusal(error)
        if permanent is not None:
            return AttemptFailed(Verdict.PARK, record=False, reason=permanent)
        failing_for = now_ms - self.failing_since_ms
        if failing_for >= self.fail_after_ms:
            reason = f"no message handled for {_seconds(self.fail_after_ms)} s: {describe(error)}"
            return AttemptFailed(Verdict.PARK, record=False, reason=reason)
        return AttemptFailed(
            Verdict.RETRY, record=record, park_in=(self.fail_after_ms - failing_for) / 1000
        )

    def recorded(self) -> None:
        """The ``failing_since_ms`` write landed."""
        self.on_item = True

    def message_handled(self) -> bool:
        """A message was handled: the streak is over. True when the item's mark must
        be removed (one write; call :meth:`cleared` once it landed)."""
        self.failing_since_ms = None
        return self.on_item

    def cleared(self) -> None:
        self.on_item = False


def _seconds(ms: int) -> str:
    return f"{ms // 1000}" if ms % 1000 == 0 else f"{ms / 1000:g}"
