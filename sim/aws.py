"""The AWS services of the simulated fleet, as boto3-shaped clients.

Each process has its own clients over one :class:`Link`, which decides what the
network and the service do to each request: the latency there and back (a
distribution, plus brownouts), a partition (the request never arrives; the call times
out), throttling, a write applied whose reply is lost, a 500 after the write applied.
A request is applied at the instant it arrives, outside every process (as the real
service does it, whatever happens to the caller meanwhile), and the caller's
greenlet waits for the reply with botocore's own rules: a timeout per attempt, the
configured number of attempts, and the standard mode's backoff between them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from sim.dynamodb import DynamoDBEngine
from sim.runtime import SimLoop, World, await_only
from wsfleet.schema import PARTITION_KEY

ENDPOINT = "https://sim.invalid"


@dataclass
class Link:
    """What the network and the services do to one process's requests."""

    world: World
    latency: Callable[[], float]
    """One way, in seconds, outside brownouts."""
    brownouts: list[tuple[float, float, float]] = field(default_factory=list)
    """(from, until, extra one-way seconds)."""
    partitions: list[tuple[float, float]] = field(default_factory=list)
    throttle: float = 0.0
    """Probability that a request is refused as throttled (nothing applied)."""
    lost_reply: float = 0.0
    """Probability that a request applied gets no reply (the caller times out)."""
    error_after_apply: float = 0.0
    """Probability that a request applied is answered with a 500."""
    stale_by: float = 0.0
    """How old an eventually consistent read may be."""
    index_lag: float = 0.0
    after_send: Callable[[str], None] | None = None
    """Called with the operation as each request leaves (a fault may pause the process
    right then, its write on its way)."""

    def one_way(self, now: float) -> float | None:
        """The latency of a message sent at ``now``; None: it never arrives."""
        for start, end in self.partitions:
            if start <= now < end:
                return None
        extra = sum(e for start, end, e in self.brownouts if start <= now < end)
        return self.latency() + extra


@dataclass(frozen=True)
class Retries:
    """A client's botocore settings (worker.aws_clients)."""

    attempt_timeout: float
    attempts: int

    @classmethod
    def of(cls, config: Config) -> Retries:
        """What a botocore ``Config`` of the production clients says."""
        settings: Any = config  # botocore's stubs leave its options out
        retries = settings.retries or {}
        return cls(float(settings.read_timeout), int(retries.get("total_max_attempts", 3)))


class Caller:
    """Sends one process's requests over its link."""

    def __init__(self, loop: SimLoop, link: Link, retries: Retries) -> None:
        self.loop = loop
        self.link = link
        self.retries = retries

    def call(self, operation: str, apply: Callable[[float], Any]) -> Any:
        """From blocking code: make the request, with retries."""
        rng = self.link.world.rng
        attempt = 0
        while True:
            try:
                result = self._attempt(operation, apply)
            except (ClientError, ReadTimeoutError, EndpointConnectionError) as error:
                if isinstance(error, ClientError):
                    # As botocore says how many retries an answer took.
                    response = cast(dict[str, Any], error.response)
                    response.setdefault("ResponseMetadata", {})["RetryAttempts"] = attempt
                attempt += 1
                if attempt >= self.retries.attempts or not _retryable(error):
                    raise
                base = 1.0 if _throttled(error) else 0.05
                self._sleep(rng.random() * min(base * 2**attempt, 20.0))
                continue
            if isinstance(result, dict):
                result.setdefault("ResponseMetadata", {})["RetryAttempts"] = attempt
            return result

    def _sleep(self, seconds: float) -> None:
        loop = self.loop
        woken: asyncio.Future[None] = loop.create_future()
        loop.call_at(loop.time() + seconds, _settle, woken, None, None)
        await_only(woken)

    def _attempt(self, operation: str, apply: Callable[[float], Any]) -> Any:
        link, world, loop = self.link, self.link.world, self.loop
        rng = world.rng
        reply: asyncio.Future[Any] = loop.create_future()
        there = link.one_way(world.now)

        def arrive() -> None:
            if rng.random() < link.throttle:
                answer(None, _error("ProvisionedThroughputExceededException", operation, 400))
                return
            try:
                result, error = apply(world.now), None
            except ClientError as refused:
                result, error = None, refused
            if rng.random() < link.lost_reply:
                return
            if error is None and rng.random() < link.error_after_apply:
                error = _error("InternalServerError", operation, 500)
            answer(result, error)

        def answer(result: Any, error: BaseException | None) -> None:
            back = link.one_way(world.now)
            if back is None or loop.crashed:
                return
            loop.call_at(loop.at_world(world.now + back), _settle, reply, result, error)

        if there is not None:
            world.at(world.now + there, arrive)
        if link.after_send is not None:
            link.after_send(operation)
        # The client's read timeout: the attempt fails unless the reply came first.
        timeout = loop.call_at(
            loop.time() + self.retries.attempt_timeout,
            _settle,
            reply,
            None,
            ReadTimeoutError(endpoint_url=ENDPOINT),
        )
        try:
            return await_only(reply)
        finally:
            timeout.cancel()


def _settle(reply: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if reply.done():
        return
    if error is not None:
        reply.set_exception(error)
    else:
        reply.set_result(result)


def _error(code: str, operation: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)


def _throttled(error: Exception) -> bool:
    return isinstance(error, ClientError) and error.response["Error"]["Code"] in (
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
    )


def _retryable(error: Exception) -> bool:
    if not isinstance(error, ClientError):
        return True
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400)
    return _throttled(error) or status >= 500


# --- DynamoDB ---------------------------------------------------------------------------


class HotKeys:
    """Items whose partition refuses writes for a while, for every client: DynamoDB
    throttles per partition, so one hot item's writes fail while the rest of the
    table, and that item's reads, go on."""

    def __init__(self) -> None:
        self.until: dict[str, float] = {}
        """Partition key -> when its writes are accepted again."""

    def refuses(self, operation: str, params: dict[str, Any], now: float) -> bool:
        if not self.until or operation not in _WRITES:
            return False
        if operation == "transact_write_items":
            keys = [
                write.get("Key") or write.get("Item") or {}
                for entry in params["TransactItems"]
                for write in entry.values()
            ]
        else:
            keys = [params.get("Key") or params.get("Item") or {}]
        return any(
            self.until.get(key.get(PARTITION_KEY, {}).get("S", ""), 0.0) > now for key in keys
        )


_WRITES = frozenset({"update_item", "put_item", "delete_item", "transact_write_items"})


class SimDynamoDB:
    """A boto3 DynamoDB client over the engine (the methods the code calls)."""

    def __init__(self, engine: DynamoDBEngine, caller: Caller, hot: HotKeys | None = None) -> None:
        self._engine = engine
        self._caller = caller
        self._hot = hot

    def _call(self, operation: str, params: dict[str, Any]) -> Any:
        link = self._caller.link
        engine, hot = self._engine, self._hot

        def apply(now: float) -> Any:
            if hot is not None and hot.refuses(operation, params, now):
                raise _error("ProvisionedThroughputExceededException", operation, 400)
            return engine.call(
                operation, params, now=now, stale_by=link.stale_by, index_lag=link.index_lag
            )

        return self._caller.call(operation, apply)

    def get_item(self, **params: Any) -> Any:
        return self._call("get_item", params)

    def put_item(self, **params: Any) -> Any:
        return self._call("put_item", params)

    def update_item(self, **params: Any) -> Any:
        return self._call("update_item", params)

    def delete_item(self, **params: Any) -> Any:
        return self._call("delete_item", params)

    def query(self, **params: Any) -> Any:
        return self._call("query", params)

    def scan(self, **params: Any) -> Any:
        return self._call("scan", params)

    def batch_get_item(self, **params: Any) -> Any:
        return self._call("batch_get_item", params)

    def transact_write_items(self, **params: Any) -> Any:
        return self._call("transact_write_items", params)


# --- SQS -------------------------------------------------------------------------------


@dataclass
class _Message:
    message_id: str
    body: str
    visible_at: float = 0.0
    receives: int = 0
    receipt: str = ""


class SimQueue:
    """One SQS standard queue with a redrive policy (maxReceiveCount)."""

    def __init__(self, world: World, *, visibility: float = 60.0, max_receives: int = 5) -> None:
        self._world = world
        self._visibility = visibility
        self._max_receives = max_receives
        self._messages: dict[str, _Message] = {}
        self._ids = itertools.count(1)
        self._waiters: list[tuple[SimLoop, asyncio.Future[None]]] = []
        self.dead_letters: list[str] = []

    def send(self, body: str) -> str:
        message_id = f"m{next(self._ids)}"
        self._messages[message_id] = _Message(message_id, body, self._world.now)
        self._wake()
        return message_id

    def receive(self, max_messages: int) -> list[dict[str, Any]]:
        now = self._world.now
        out: list[dict[str, Any]] = []
        for message in list(self._messages.values()):
            if len(out) >= max_messages:
                break
            if message.visible_at > now:
                continue
            if message.receives >= self._max_receives:
                del self._messages[message.message_id]
                self.dead_letters.append(message.body)
                continue
            message.receives += 1
            message.visible_at = now + self._visibility
            message.receipt = f"{message.message_id}/{message.receives}"
            self._world.at(message.visible_at, self._wake)
            out.append(
                {
                    "MessageId": message.message_id,
                    "ReceiptHandle": message.receipt,
                    "Body": message.body,
                    "Attributes": {"ApproximateReceiveCount": str(message.receives)},
                }
            )
        return out

    def delete(self, receipt: str) -> None:
        message_id = receipt.split("/")[0]
        message = self._messages.get(message_id)
        if message is not None and message.receipt == receipt:
            del self._messages[message_id]

    def change_visibility(self, receipt: str, seconds: float) -> None:
        message = self._messages.get(receipt.split("/")[0])
        if message is None or message.receipt != receipt:
            raise _error("ReceiptHandleIsInvalid", "ChangeMessageVisibility", 400)
        message.visible_at = self._world.now + seconds
        self._world.at(message.visible_at, self._wake)

    async def wait(self, loop: SimLoop, seconds: float) -> None:
        """Until a message may be visible, or ``seconds`` pass."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((loop, waiter))
        try:
            async with asyncio.timeout(seconds):
                await waiter
        except TimeoutError:
            pass
        finally:
            self._waiters = [(lp, w) for lp, w in self._waiters if w is not waiter]

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            if not loop.crashed:
                loop.call_soon(_settle, waiter, None, None)


class SimSQS:
    """A boto3 SQS client for one queue (the start queue).

    ``lost(body)`` is told of each message this client received but its caller never
    saw (the reply lost or too late) or never settled (its process crashed): the
    message stays invisible for the visibility timeout, its hint lost meanwhile."""

    def __init__(
        self,
        queue: SimQueue,
        caller: Caller,
        lost: Callable[[str], None] | None = None,
        *,
        poll: Caller | None = None,
    ) -> None:
        """``caller``: every call but ReceiveMessage; ``poll``: ReceiveMessage's (None:
        ``caller``), as the worker has a client of its own for the long poll."""
        self._queue = queue
        self._caller = caller
        self._poll = caller if poll is None else poll
        self._lost = lost
        self._unsettled: dict[str, str] = {}
        """Receipt -> body of each message handed to the caller and not settled."""
        self._exited = False

    def _receive(self, max_messages: int) -> list[dict[str, Any]]:
        queue = self._queue
        received: list[dict[str, Any]] = []

        def apply(now: float) -> list[dict[str, Any]]:
            messages = queue.receive(max_messages)
            received.extend(messages)
            return messages

        try:
            messages: list[dict[str, Any]] = self._poll.call("ReceiveMessage", apply)
        except BaseException:
            self._lose(received)
            raise
        got = {m["ReceiptHandle"] for m in messages}
        self._lose([m for m in received if m["ReceiptHandle"] not in got])
        self._unsettled.update((m["ReceiptHandle"], m["Body"]) for m in messages)
        return messages

    def _lose(self, messages: list[dict[str, Any]]) -> None:
        if self._lost is not None:
            for message in messages:
                self._lost(message["Body"])

    def exited(self) -> None:
        """The process exited: it sends nothing more. A long poll it left waiting ends
        with nothing when its wait does (a real long poll is one request; the process
        gone, nothing answers it)."""
        self._exited = True

    def crashed(self) -> None:
        """The process died: what it received and did not settle is lost with it."""
        unsettled, self._unsettled = self._unsettled, {}
        self._lose([{"Body": body} for body in unsettled.values()])

    def send_message(self, *, QueueUrl: str, MessageBody: str) -> dict[str, Any]:  # noqa: N803
        queue = self._queue
        message_id = self._caller.call("SendMessage", lambda now: queue.send(MessageBody))
        return {"MessageId": message_id}

    def receive_message(self, *, MaxNumberOfMessages: int, WaitTimeSeconds: int, **_: Any) -> Any:  # noqa: N803
        queue, caller = self._queue, self._poll
        messages = self._receive(MaxNumberOfMessages)
        if not messages and WaitTimeSeconds:
            await_only(queue.wait(caller.loop, WaitTimeSeconds))
            if self._exited:
                return {}
            messages = self._receive(MaxNumberOfMessages)
        return {"Messages": messages} if messages else {}

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict[str, Any]:  # noqa: N803
        queue = self._queue
        self._settle(ReceiptHandle, "DeleteMessage", lambda now: queue.delete(ReceiptHandle))
        return {}

    def change_message_visibility(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        ReceiptHandle: str,  # noqa: N803
        VisibilityTimeout: int,  # noqa: N803
    ) -> dict[str, Any]:
        queue = self._queue
        self._settle(
            ReceiptHandle,
            "ChangeMessageVisibility",
            lambda now: queue.change_visibility(ReceiptHandle, VisibilityTimeout),
        )
        return {}

    def _settle(self, receipt: str, operation: str, apply: Callable[[float], Any]) -> None:
        body = self._unsettled.pop(receipt, None)
        try:
            self._caller.call(operation, apply)
        except BaseException:
            # Unsettled, the message stays invisible (a failed hand-back, say).
            if body is not None:
                self._lose([{"Body": body}])
            raise
