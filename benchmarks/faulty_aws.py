"""A fault-injecting AWS endpoint for the sink benchmarks: an HTTP server on loopback in
front of the moto server, at which the workers' ``AWS_ENDPOINT_URL_KINESIS``,
``AWS_ENDPOINT_URL_FIREHOSE`` and ``AWS_ENDPOINT_URL_SQS`` point.

Every request is forwarded to moto as it came, and moto's answer returned as it came,
except the sinks' three batch writes, told by their ``X-Amz-Target`` (JSON protocols,
SQS's included): ``Kinesis_20131202.PutRecords``, ``Firehose_20150804.PutRecordBatch``
and ``AmazonSQS.SendMessageBatch``. Of those it parses the body and, with its own
seeded random numbers (:class:`Faults`):

- **refuses records** one by one (``refuse``, a share of the records): Kinesis
  ``InternalFailure`` or ``ProvisionedThroughputExceededException``, Firehose
  ``ServiceUnavailableException`` or ``InternalFailure``, SQS an entry failure with
  ``SenderFault: false`` (``InternalError`` or ``ServiceUnavailable``);
- **throttles**: a token bucket per destination (``throttle`` records a second,
  holding ``burst`` seconds of it; per stream, not per shard), every record beyond it
  refused as the service refuses a throttled one (``ProvisionedThroughputExceededException``,
  ``ServiceUnavailableException``, SQS ``RequestThrottled``);
- **delays requests** (``delay``, a share of the requests, by ``delay_seconds``,
  below the sinks' 10 s read timeout) before anything else: when the worker that
  sent one is killed meanwhile, the request lands after its connections' new owner
  wrote: a superseded owner's late request;
- **fails requests** (``request_errors``, a share of the requests) with HTTP 500
  ``InternalFailure`` (SQS ``InternalError``), half of them before forwarding and half
  after (the records landed, the answer is lost), which botocore sends again whole;
- **fails calls** (``failed_calls``, a share of botocore's invocations, told by
  ``amz-sdk-invocation-id``): every attempt of the call fails as above, so the call
  fails and the worker sends the batch again.

The records it keeps go to moto in a body rewritten without the refused ones (moto
checks no signature), and the answer is the one the service gives: the refused
entries in place among moto's (Kinesis ``FailedRecordCount`` and ``Records``,
Firehose ``FailedPutCount`` and ``RequestResponses``, SQS ``Successful`` and
``Failed``). With ``absorb``, nothing of a batch write reaches moto: the endpoint
answers for the records it takes (a sink with no destination behind it, for load
that moto could not store).

It counts what it did per service (:class:`Counts`). A request names its sender
through botocore's ``AWS_SDK_UA_APP_ID`` (``app/<id>`` in the ``User-Agent``); once
told that a sender exited (:meth:`FaultyAws.note_exit`), a delayed request of it that
is forwarded afterwards counts as **late**.

:class:`FaultyAws` serves on a thread of the caller's process;
:class:`FaultyAwsProcess` runs ``python -m benchmarks.faulty_aws --upstream URL
[--port N] [--refuse 0.05] ...`` (which serves until SIGINT or SIGTERM, then prints its
counts as one JSON line) and drives it through the endpoint's own control paths, under
``/_faulty_aws/`` (no AWS request has such a path: JSON protocols post to ``/``, and
``_`` is not allowed in an S3 bucket's name): ``GET counts``, ``POST exits/<sender>``,
``GET idle?timeout=S``. In a process of its own, it does not share a GIL with the
caller's threads.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import http.client
import itertools
import json
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal, Protocol
from urllib.parse import parse_qs, quote, unquote, urlsplit

from local_stack import services

LOOPBACK: Final = "127.0.0.1"
ACCOUNT: Final = "123456789012"
UPSTREAM_TIMEOUT_S: Final = 60.0
"""Longer than any SQS long poll (20 s) that goes through."""
INVOCATIONS_KEPT: Final = 100_000
"""How many botocore invocations the endpoint remembers the fate of."""
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "content-length",
        # The server's own, which every answer of this one carries.
        "server",
        "date",
    }
)
_APP_ID: Final = re.compile(r"(?:^|\s)app/(\S+)")
INVOCATION_HEADER: Final = "amz-sdk-invocation-id"
CONTROL: Final = "/_faulty_aws/"
"""Where the endpoint's own control paths start."""


# --- the services' batch writes -------------------------------------------------------------


Item = dict[str, Any]
"""One record (Kinesis, Firehose) or entry (SQS) of a request, as its JSON has it."""
Result = dict[str, Any]
"""One record's or entry's part of an answer: taken, or refused."""


@dataclass(frozen=True, slots=True)
class BatchApi:
    """One service's batch write: where its records are in a request, how the service
    answers for each, and what it says when it refuses one."""

    service: str
    target: str
    """``X-Amz-Target``."""
    items: str
    """The request's list of records."""
    content_type: str
    refusal_codes: tuple[str, ...]
    """What a record refused for no reason of its own is refused with (drawn)."""
    throttle_code: str
    error_code: str
    """What a whole request failed by the service is answered with."""

    def destination(self, body: Mapping[str, Any]) -> str:
        """The stream's, delivery stream's or queue's name."""
        if self.service == "kinesis":
            name = body.get("StreamName") or str(body.get("StreamARN", "")).rpartition("/")[2]
            return str(name)
        if self.service == "firehose":
            return str(body.get("DeliveryStreamName", ""))
        return urlsplit(str(body.get("QueueUrl", ""))).path.rpartition("/")[2]

    def refusal(self, item: Item, code: str, destination: str) -> Result:
        """The answer's entry for a record refused with ``code``."""
        if self.service == "sqs":
            return {
                "Id": item.get("Id"),
                "SenderFault": False,
                "Code": code,
                "Message": _MESSAGES[code].format(destination=destination),
            }
        return {"ErrorCode": code, "ErrorMessage": _MESSAGES[code].format(destination=destination)}

    @staticmethod
    def refused(result: Result) -> bool:
        return "ErrorCode" in result or "Code" in result

    def results(self, answer: Mapping[str, Any], forwarded: Sequence[Item]) -> list[Result]:
        """The answer's entry for each record of ``forwarded``, in order."""
        if self.service == "sqs":
            by_id = {r.get("Id"): r for r in answer.get("Successful", ())}
            by_id.update({r.get("Id"): r for r in answer.get("Failed", ())})
            return [
                by_id.get(
                    item.get("Id"),
                    {"Id": item.get("Id"), "SenderFault": False, "Code": "InternalError"},
                )
                for item in forwarded
            ]
        listed = list(
            answer.get("Records" if self.service == "kinesis" else "RequestResponses", ())
        )
        if len(listed) != len(forwarded):
            raise ValueError(
                f"{self.service}: {len(listed)} results for {len(forwarded)} records forwarded"
            )
        return listed

    def answer(self, results: Sequence[Result], upstream: Mapping[str, Any]) -> dict[str, Any]:
        """The whole answer, from every record's result in the request's order and
        what else moto answered (``{}``: nothing was forwarded)."""
        failed = sum(1 for r in results if self.refused(r))
        if self.service == "kinesis":
            extra = {k: v for k, v in upstream.items() if k == "EncryptionType"}
            return {"FailedRecordCount": failed, "Records": list(results), **extra}
        if self.service == "firehose":
            return {
                "FailedPutCount": failed,
                "Encrypted": bool(upstream.get("Encrypted", False)),
                "RequestResponses": list(results),
            }
        return {
            "Successful": [r for r in results if not self.refused(r)],
            "Failed": [r for r in results if self.refused(r)],
        }

    def taken(self, item: Item, number: int) -> Result:
        """The answer's entry for a record taken without moto (``absorb``); ``number``
        makes sequence numbers and ids unique."""
        if self.service == "kinesis":
            return {"SequenceNumber": f"{number:056d}", "ShardId": "shardId-000000000000"}
        if self.service == "firehose":
            return {"RecordId": str(uuid.UUID(int=number))}
        body = str(item.get("MessageBody", ""))
        return {
            "Id": item.get("Id"),
            "MessageId": str(uuid.UUID(int=number)),
            "MD5OfMessageBody": hashlib.md5(body.encode()).hexdigest(),
            "SequenceNumber": f"{number:020d}",
        }

    def error(self, code: str, message: str) -> tuple[dict[str, str], bytes]:
        """Headers and body of a whole request failed with ``code`` (status 500)."""
        headers = {"Content-Type": self.content_type, "x-amzn-ErrorType": code}
        kind = code
        if self.service == "sqs":
            # SQS's JSON protocol, compatible with its query protocol (botocore reads both).
            kind = f"com.amazonaws.sqs#{code}"
            headers["x-amzn-query-error"] = f"{code};Receiver"
        return headers, json.dumps({"__type": kind, "message": message}).encode()


_MESSAGES: Final = {
    "InternalFailure": "Internal service failure.",
    "ProvisionedThroughputExceededException": (
        "Rate exceeded for stream {destination} under account " + ACCOUNT + "."
    ),
    "ServiceUnavailableException": "Slow down.",
    "InternalError": "We encountered an internal error. Please try again.",
    "ServiceUnavailable": "The request has failed due to a temporary failure of the server.",
    "RequestThrottled": "Rate exceeded.",
}

KINESIS: Final = BatchApi(
    "kinesis",
    "Kinesis_20131202.PutRecords",
    "Records",
    "application/x-amz-json-1.1",
    ("InternalFailure", "ProvisionedThroughputExceededException"),
    "ProvisionedThroughputExceededException",
    "InternalFailure",
)
FIREHOSE: Final = BatchApi(
    "firehose",
    "Firehose_20150804.PutRecordBatch",
    "Records",
    "application/x-amz-json-1.1",
    ("ServiceUnavailableException", "InternalFailure"),
    "ServiceUnavailableException",
    "InternalFailure",
)
SQS: Final = BatchApi(
    "sqs",
    "AmazonSQS.SendMessageBatch",
    "Entries",
    "application/x-amz-json-1.0",
    ("InternalError", "ServiceUnavailable"),
    "RequestThrottled",
    "InternalError",
)
BATCH_APIS: Final = {api.target: api for api in (KINESIS, FIREHOSE, SQS)}
SERVICES: Final = tuple(api.service for api in BATCH_APIS.values())


# --- what to inject, and what was -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Faults:
    """What the endpoint does to the batch writes (every share from 0 to 1)."""

    refuse: float = 0.0
    """Share of the records refused one by one."""
    throttle: float | None = None
    """Records a second each destination takes (None: no limit)."""
    burst: float = 1.0
    """Seconds of ``throttle`` a destination's bucket holds (at least one record)."""
    delay: float = 0.0
    """Share of the requests held before anything else is done with them."""
    delay_seconds: tuple[float, float] = (3.0, 7.0)
    """How long a delayed request is held: drawn evenly between the two."""
    request_errors: float = 0.0
    """Share of the requests failed whole (HTTP 500), half after forwarding."""
    failed_calls: float = 0.0
    """Share of the calls (botocore invocations) every attempt of which fails."""
    absorb: bool = False
    """Answer the batch writes without moto."""
    seed: int = 0

    def __post_init__(self) -> None:
        shares = {
            "refuse": self.refuse,
            "delay": self.delay,
            "request_errors": self.request_errors,
            "failed_calls": self.failed_calls,
        }
        for name, share in shares.items():
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be a share from 0 to 1, got {share}")
        if self.throttle is not None and not self.throttle > 0:
            raise ValueError(f"throttle must be > 0 records/s, got {self.throttle}")
        if not self.burst > 0:
            raise ValueError(f"burst must be > 0 s, got {self.burst}")
        low, high = self.delay_seconds
        if not 0 <= low <= high:
            raise ValueError(f"delay_seconds must be 0 <= low <= high, got {self.delay_seconds}")


@dataclass(slots=True)
class Counts:
    """What the endpoint did to one service's batch writes."""

    requests: int = 0
    records: int = 0
    forwarded: int = 0
    """Records sent on to moto (or taken, with ``absorb``)."""
    refused: int = 0
    """Records refused one by one, throttles apart."""
    throttled: int = 0
    delayed: int = 0
    """Requests held before being handled."""
    late: int = 0
    """Delayed requests forwarded after their sender exited."""
    late_records: int = 0
    """Records those late requests forwarded."""
    request_errors: int = 0
    """Requests failed whole (HTTP 500), those of failed calls included."""
    answers_lost: int = 0
    """Of those: forwarded first, so their records landed."""
    failed_calls: int = 0
    """Calls every attempt of which fails."""
    upstream_errors: int = 0
    """Requests moto refused whole (passed on as moto answered)."""

    def copy(self) -> Counts:
        return dataclasses.replace(self)


class TokenBucket:
    """``rate`` tokens a second, ``capacity`` at most, full at first."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self._rate = rate
        self._capacity = capacity
        self._tokens = capacity
        self._at = now

    def take(self, now: float) -> bool:
        """One token, if there is one."""
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = max(self._at, now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


@dataclass(frozen=True, slots=True)
class Plan:
    """What becomes of one request."""

    delay: float
    """Seconds to hold it first."""
    fail: Literal["before", "after"] | None
    """The request fails whole, before or after it is forwarded; None: it does not."""


Landed = Callable[[str, str, Sequence[Item]], None]
"""Told, per batch write, the service, the destination and the records it took (as
the request carried them), in order."""


class FaultPlanner:
    """The decisions of :class:`FaultyAws`, without HTTP: thread-safe, one random
    source drawn in the order the decisions are made."""

    def __init__(self, faults: Faults, clock: Callable[[], float] = time.monotonic) -> None:
        self.faults = faults
        self._clock = clock
        self._rng = random.Random(faults.seed)
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._invocations: dict[str, bool] = {}
        self._counts = {service: Counts() for service in SERVICES}
        self._exits: dict[str, float] = {}
        self._numbers = itertools.count(1)

    def counts(self) -> dict[str, Counts]:
        with self._lock:
            return {service: c.copy() for service, c in self._counts.items()}

    def count(self, service: str, **added: int) -> None:
        with self._lock:
            counts = self._counts[service]
            for name, value in added.items():
                setattr(counts, name, getattr(counts, name) + value)

    def note_exit(self, sender: str, at: float | None = None) -> None:
        with self._lock:
            self._exits.setdefault(sender, self._clock() if at is None else at)

    def exited(self, sender: str | None) -> bool:
        """Whether ``sender`` is known to have exited by now."""
        if sender is None:
            return False
        with self._lock:
            at = self._exits.get(sender)
        return at is not None and at <= self._clock()

    def number(self) -> int:
        with self._lock:
            return next(self._numbers)

    def plan(self, api: BatchApi, invocation: str | None) -> Plan:
        """Whether to hold the request and whether it fails whole; counted."""
        f = self.faults
        with self._lock:
            counts = self._counts[api.service]
            counts.requests += 1
            delay = 0.0
            if f.delay and self._rng.random() < f.delay:
                delay = self._rng.uniform(*f.delay_seconds)
                counts.delayed += 1
            failing = False
            if invocation is not None and f.failed_calls:
                failing = self._invocations.get(invocation, False)
                if invocation not in self._invocations:
                    failing = self._rng.random() < f.failed_calls
                    counts.failed_calls += int(failing)
                    if len(self._invocations) >= INVOCATIONS_KEPT:
                        del self._invocations[next(iter(self._invocations))]
                    self._invocations[invocation] = failing
            if not failing and f.request_errors:
                failing = self._rng.random() < f.request_errors
            fail: Literal["before", "after"] | None = None
            if failing:
                fail = "after" if self._rng.random() < 0.5 else "before"
                counts.request_errors += 1
                counts.answers_lost += int(fail == "after")
            return Plan(delay, fail)

    def refusals(self, api: BatchApi, destination: str, items: Sequence[Item]) -> list[str | None]:
        """Each record's refusal code (None: it goes through), drawn now; counted."""
        f = self.faults
        with self._lock:
            counts = self._counts[api.service]
            counts.records += len(items)
            bucket = None
            if f.throttle is not None:
                key = (api.service, destination)
                bucket = self._buckets.get(key)
                if bucket is None:
                    capacity = max(1.0, f.throttle * f.burst)
                    bucket = self._buckets[key] = TokenBucket(f.throttle, capacity, self._clock())
            now = self._clock()
            codes: list[str | None] = []
            for _ in items:
                if bucket is not None and not bucket.take(now):
                    codes.append(api.throttle_code)
                    counts.throttled += 1
                elif f.refuse and self._rng.random() < f.refuse:
                    codes.append(self._rng.choice(api.refusal_codes))
                    counts.refused += 1
                else:
                    codes.append(None)
            counts.forwarded += codes.count(None)
            return codes


# --- the server ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class FaultyAws:
    """The endpoint: :meth:`start` serves it on a thread of its own (``port`` 0: a
    free one), :meth:`close` stops it. ``upstream``: moto's URL. ``landed``: told of
    the records each batch write took (with ``absorb``, the only record of them)."""

    def __init__(
        self,
        upstream: str,
        faults: Faults = Faults(),
        *,
        host: str = LOOPBACK,
        port: int = 0,
        landed: Landed | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream!r}")
        self._upstream = (parts.hostname, parts.port or 80)
        self.planner = FaultPlanner(faults, clock)
        self._landed = landed
        self._stopping = threading.Event()
        self._in_flight = 0
        self._idle = threading.Condition()
        self._server = _Server((host, port), _Handler, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faulty-aws", daemon=True
        )

    def __enter__(self) -> FaultyAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def faults(self) -> Faults:
        return self.planner.faults

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def endpoint(self) -> str:
        """The URL to give as ``AWS_ENDPOINT_URL_<SERVICE>``."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> FaultyAws:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; requests still held go on at once. Idempotent."""
        self._stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def counts(self) -> dict[str, Counts]:
        return self.planner.counts()

    def note_exit(self, sender: str, at: float | None = None) -> None:
        """``sender`` (its ``AWS_SDK_UA_APP_ID``) exited at ``at`` (monotonic; now by
        default): its delayed requests forwarded from then on count as late."""
        self.planner.note_exit(sender, at)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is being handled (held ones included); whether it
        came to that within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    @contextlib.contextmanager
    def _handling(self) -> Iterator[None]:
        with self._idle:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    # -- one request

    def handle(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> Response:
        if path.startswith(CONTROL):
            return self._control(method, path)
        with self._handling():
            target = _header(headers, "X-Amz-Target")
            api = BATCH_APIS.get(target or "")
            if api is None or method != "POST":
                return self._forward(method, path, headers, body)
            return self._batch(api, path, headers, body)

    def _batch(
        self, api: BatchApi, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> Response:
        planner = self.planner
        plan = planner.plan(api, _header(headers, INVOCATION_HEADER))
        if plan.delay:
            self._stopping.wait(plan.delay)  # closing lets it go on at once
        sender = _sender(headers)
        late = bool(plan.delay) and planner.exited(sender)
        if plan.fail == "before":
            return self._error(api)
        try:
            request = json.loads(body)
            items = list(request[api.items])
        except (ValueError, KeyError, TypeError):
            return self._forward("POST", path, headers, body)  # moto says what is wrong
        destination = api.destination(request)
        codes = planner.refusals(api, destination, items)
        kept = [item for item, code in zip(items, codes, strict=True) if code is None]
        if late:
            planner.count(api.service, late=1, late_records=len(kept))
        upstream: dict[str, Any] = {}
        taken: list[Result] = []
        response_headers: list[tuple[str, str]] = [("Content-Type", api.content_type)]
        if kept and self.faults.absorb:
            taken = [api.taken(item, planner.number()) for item in kept]
        elif kept:
            forwarded_body = body if len(kept) == len(items) else _rewritten(request, api, kept)
            answer = self._forward("POST", path, headers, forwarded_body)
            if answer.status != 200:
                planner.count(api.service, upstream_errors=1)
                return answer
            upstream = json.loads(answer.body)
            taken = api.results(upstream, kept)
            response_headers = answer.headers
        if self._landed is not None:
            landed = [item for item, r in zip(kept, taken, strict=True) if not api.refused(r)]
            if landed:
                self._landed(api.service, destination, landed)
        if plan.fail == "after":
            return self._error(api)
        answers = iter(taken)
        results = [
            next(answers) if code is None else api.refusal(item, code, destination)
            for item, code in zip(items, codes, strict=True)
        ]
        payload = json.dumps(api.answer(results, upstream), separators=(",", ":")).encode()
        if not any(k.lower() == "x-amzn-requestid" for k, _ in response_headers):
            response_headers.append(("x-amzn-RequestId", str(uuid.uuid4())))
        return Response(200, response_headers, payload)

    def _control(self, method: str, path: str) -> Response:
        """The control paths (not counted as requests in flight)."""
        parts = urlsplit(path)
        what = parts.path[len(CONTROL) :]
        if method == "GET" and what == "counts":
            return _json(200, counts_json(self.counts()))
        if method == "POST" and what.startswith("exits/"):
            self.note_exit(unquote(what[len("exits/") :]))
            return _json(200, {})
        if method == "GET" and what == "idle":
            timeout = float(parse_qs(parts.query).get("timeout", ["0"])[0])
            return _json(200, {"idle": self.wait_idle(timeout)})
        return _json(404, {"message": f"no control {method} {what!r}"})

    def _error(self, api: BatchApi) -> Response:
        headers, body = api.error(api.error_code, _MESSAGES[api.error_code])
        listed = [*headers.items(), ("x-amzn-RequestId", str(uuid.uuid4()))]
        return Response(500, listed, body)

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> Response:
        """The request to moto as it came (hop-by-hop headers apart), on a connection
        of its own: moto closes each after its answer."""
        connection = http.client.HTTPConnection(*self._upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    connection.putheader(name, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            answer = connection.getresponse()
            data = answer.read()
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP]
            return Response(answer.status, kept, data)
        except OSError as error:
            message = f"upstream {self._upstream[0]}:{self._upstream[1]}: {error!r}"
            return Response(502, [("Content-Type", "text/plain")], message.encode())
        finally:
            connection.close()


def _json(status: int, value: object) -> Response:
    return Response(status, [("Content-Type", "application/json")], json.dumps(value).encode())


def _rewritten(request: Mapping[str, Any], api: BatchApi, kept: Sequence[Item]) -> bytes:
    return json.dumps({**request, api.items: list(kept)}, separators=(",", ":")).encode()


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers if k.lower() == wanted), None)


def _sender(headers: Sequence[tuple[str, str]]) -> str | None:
    """The ``app/<id>`` of the request's ``User-Agent`` (``AWS_SDK_UA_APP_ID``)."""
    match = _APP_ID.search(_header(headers, "User-Agent") or "")
    return match.group(1) if match else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many workers' pooled connections at once.
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], handler: type[_Handler], endpoint: FaultyAws
    ) -> None:
        self.endpoint = endpoint
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A killed worker resets its connections: nothing to report.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _serve(self) -> None:
        try:
            body = self._body()
        except ValueError as error:
            self.send_error(400, str(error))
            return
        response = self.server.endpoint.handle(
            self.command, self.path, list(self.headers.items()), body
        )
        try:
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            self.wfile.flush()
        except OSError:
            # The client went away (a killed worker): nobody to answer.
            self.close_connection = True

    # http.server's names for the methods it serves.
    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _serve  # noqa: N815

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._chunked()
        return b""

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def log_message(self, format: str, *args: Any) -> None:
        return None  # one line per request would drown the benchmark's own


# --- in a process of its own ----------------------------------------------------------------


class FaultEndpoint(Protocol):
    """What a caller uses of an endpoint, in its process or another."""

    @property
    def endpoint(self) -> str: ...

    @property
    def faults(self) -> Faults: ...

    def counts(self) -> dict[str, Counts]: ...

    def note_exit(self, sender: str) -> None: ...

    def wait_idle(self, timeout: float) -> bool: ...


START_TIMEOUT_S: Final = 15.0
CONTROL_TIMEOUT_S: Final = 10.0


class FaultyAwsProcess:
    """``python -m benchmarks.faulty_aws`` on a free port, driven through its control
    paths; its output goes to ``<log_dir>/faulty-aws.log``. Use as a context manager
    (:meth:`close` stops it)."""

    def __init__(self, upstream: str, faults: Faults, log_dir: Path) -> None:
        self._faults = faults
        self._port = services.free_port()
        argv = [sys.executable, "-m", "benchmarks.faulty_aws", "--upstream", upstream]
        argv += ["--port", str(self._port), *fault_args(faults)]
        log_path = log_dir / "faulty-aws.log"
        self._process = services.ManagedProcess(
            "faulty-aws", services.spawn(argv, log_path, cwd=services.REPO_ROOT), log_path
        )
        try:
            self._wait_ready()
        except BaseException:
            self._process.stop()
            raise

    def __enter__(self) -> FaultyAwsProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if not self._process.alive():
                raise RuntimeError(f"faulty-aws exited:\n{self._process.log_tail()}")
            try:
                self.counts()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"faulty-aws did not answer within {START_TIMEOUT_S:g} s:\n"
                        f"{self._process.log_tail()}"
                    ) from None
                time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def faults(self) -> Faults:
        return self._faults

    def _call(self, method: str, what: str, timeout: float = CONTROL_TIMEOUT_S) -> Any:
        connection = http.client.HTTPConnection(LOOPBACK, self._port, timeout=timeout)
        try:
            connection.request(method, CONTROL + what, body=b"" if method == "POST" else None)
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        if answer.status != 200:
            raise OSError(f"faulty-aws {method} {what}: HTTP {answer.status}: {data[:200]!r}")
        return json.loads(data)

    def counts(self) -> dict[str, Counts]:
        raw = self._call("GET", "counts")
        return {service: Counts(**fields) for service, fields in raw.items()}

    def note_exit(self, sender: str) -> None:
        self._call("POST", "exits/" + quote(sender, safe=""))

    def wait_idle(self, timeout: float) -> bool:
        answer = self._call("GET", f"idle?timeout={timeout}", timeout=timeout + CONTROL_TIMEOUT_S)
        return bool(answer["idle"])

    def close(self) -> None:
        """Stop the process (idempotent)."""
        self._process.stop()


# --- kinesis records as envelopes ------------------------------------------------------------


def kinesis_data(item: Item) -> bytes:
    """The data of a Kinesis record of a request (base64 in the JSON)."""
    return base64.b64decode(str(item.get("Data", "")))


# --- the command -----------------------------------------------------------------------------


def counts_json(counts: Mapping[str, Counts]) -> dict[str, dict[str, int]]:
    return {service: dataclasses.asdict(c) for service, c in counts.items()}


def fault_args(faults: Faults) -> list[str]:
    """The command line that gives ``faults``."""
    args = [
        "--refuse",
        repr(faults.refuse),
        "--burst",
        repr(faults.burst),
        "--delay",
        repr(faults.delay),
        "--delay-min",
        repr(faults.delay_seconds[0]),
        "--delay-max",
        repr(faults.delay_seconds[1]),
        "--request-errors",
        repr(faults.request_errors),
        "--failed-calls",
        repr(faults.failed_calls),
        "--seed",
        str(faults.seed),
    ]
    if faults.throttle is not None:
        args += ["--throttle", repr(faults.throttle)]
    if faults.absorb:
        args.append("--absorb")
    return args


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.faulty_aws", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--upstream", required=True, help="moto's URL (http://127.0.0.1:PORT)")
    parser.add_argument("--port", type=int, default=0, help="to listen on (0: a free one)")
    parser.add_argument("--refuse", type=float, default=0.0, help="share of records refused")
    parser.add_argument("--throttle", type=float, default=None, help="records/s per destination")
    parser.add_argument("--burst", type=float, default=1.0, help="seconds of the throttle rate")
    parser.add_argument("--delay", type=float, default=0.0, help="share of requests held")
    parser.add_argument("--delay-min", type=float, default=3.0, help="seconds")
    parser.add_argument("--delay-max", type=float, default=7.0, help="seconds")
    parser.add_argument("--request-errors", type=float, default=0.0, help="share of requests")
    parser.add_argument("--failed-calls", type=float, default=0.0, help="share of calls")
    parser.add_argument("--absorb", action="store_true", help="answer batch writes without moto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        args.faults = Faults(
            refuse=args.refuse,
            throttle=args.throttle,
            burst=args.burst,
            delay=args.delay,
            delay_seconds=(args.delay_min, args.delay_max),
            request_errors=args.request_errors,
            failed_calls=args.failed_calls,
            absorb=args.absorb,
            seed=args.seed,
        )
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()

    def stop_now(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_now)
    with FaultyAws(args.upstream, args.faults, port=args.port) as endpoint:
        print(f"faulty aws listening on {endpoint.endpoint}", flush=True)
        stop.wait()
    print(json.dumps(counts_json(endpoint.counts()), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
