"""Which message handler the workers run, where its code comes from, and, for the
built-in sinks, what the task role is granted and which variables name the
destination.

Nothing here imports aws_cdk at module level: ``fleetctl`` uses the handler checks
without starting jsii's Node process. The sink constructors receive CDK objects and
only call their methods.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler_requirements import REQUIREMENTS_FILE, conflicts
from wsfleet.sink_limits import FIREHOSE_LIMITS, KINESIS_LIMITS, SQS_LIMITS, max_message_bytes

if TYPE_CHECKING:
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_kinesis as kinesis
    from aws_cdk import aws_kinesisfirehose as firehose
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_sqs as sqs

FACTORY_PATTERN: Final = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""``package.module:factory``, the form of the worker's ``HANDLER``."""
IMAGE_NAMES: Final = frozenset({"worker", "wsfleet"})
"""Top-level names the image already has: a handler's own would be shadowed by them."""
KINESIS_SINK: Final = "worker.sinks.kinesis:factory"
FIREHOSE_SINK: Final = "worker.sinks.firehose:factory"
SQS_FIFO_SINK: Final = "worker.sinks.sqs_fifo:factory"
"""The built-in sinks' factories (README.md, "Sending messages on")."""
# The sinks' variables (worker/sinks/settings.py; not imported: that module is the
# worker's, which an installed copy of this package carries as files only).
SINK_STREAM_NAME: Final = "SINK_STREAM_NAME"
SINK_DELIVERY_STREAM: Final = "SINK_DELIVERY_STREAM"
SINK_QUEUE_URL: Final = "SINK_QUEUE_URL"
ECR_URI: Final = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?P<cn>\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+)(?::(?P<tag>[\w.-]{1,128})|@(?P<digest>sha256:[0-9a-f]{64}))?"
)


def check_factory(factory: str) -> str:
    """The worker's own rule for ``HANDLER`` (``worker.plugins.load_factory``), at synth."""
    if not FACTORY_PATTERN.fullmatch(factory):
        raise FleetOptionsError(
            "handler", f"factory must look like 'package.module:factory', got {factory!r}"
        )
    return factory


@dataclass(frozen=True, slots=True)
class WorkerHandler:
    """The ``HANDLER`` of every worker (``package.module:factory``, called once per
    worker process, returning an object with ``async def handle(self, delivery)`` or
    ``async def handle_batch(self, deliveries)``; README.md, "Writing a handler"), and
    the code that defines it. Make one with :meth:`from_directory`,
    :meth:`from_image` or :meth:`built_in`, or take a built-in sink with its grant:
    :meth:`kinesis`, :meth:`firehose`, :meth:`sqs_fifo`."""

    factory: str
    directory: Path | None = None
    """A directory of the user's packages, built into the worker image."""
    image_uri: str | None = None
    """An image of the user's, built FROM this project's worker image."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """Variables the handler needs (a sink's destination), set on the worker
    container; ``handler_environment`` may not set them again."""
    grant: Callable[[iam.IRole], None] | None = field(default=None, compare=False)
    """Called once with the workers' task role: grants what the handler writes to."""
    max_message_bytes: int | None = None
    """The largest message the handler can carry (a built-in sink's record limit less
    the envelope): the workers' ``MAX_MESSAGE_BYTES`` by default, and its ceiling."""

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], factory: str) -> WorkerHandler:
        """``path`` holds the handler's package(s) and, optionally, a
        ``requirements.txt``. The worker image is built from this project's worker code
        plus that directory (on the workers' ``PYTHONPATH``), with its requirements
        installed next to the worker's pins: a requirement the pins contradict fails
        here, naming both lines. ``fleetctl check-handler PATH FACTORY`` runs it once."""
        directory = Path(path).expanduser().resolve()
        check_factory(factory)
        if not directory.is_dir():
            raise FleetOptionsError("handler", f"handler directory {directory} does not exist")
        top = factory.split(".", 1)[0].split(":", 1)[0]
        if not ((directory / top).is_dir() or (directory / f"{top}.py").is_file()):
            raise FleetOptionsError(
                "handler",
                f"{factory}: the handler directory {directory} has no package {top}/ "
                f"or module {top}.py",
            )
        shadowed = sorted(
            name
            for name in top_level_names(directory)
            if name in IMAGE_NAMES or name in sys.stdlib_module_names
        )
        if shadowed:
            raise FleetOptionsError(
                "handler",
                f"the handler directory {directory} holds {', '.join(shadowed)}, which the "
                "worker image or Python already has: rename them",
            )
        requirements = directory / REQUIREMENTS_FILE
        if requirements.is_file():
            found = conflicts(requirements)
            if found:
                raise FleetOptionsError("handler", "; ".join(str(c) for c in found))
        return cls(factory=factory, directory=directory)

    @classmethod
    def from_image(cls, uri: str, factory: str) -> WorkerHandler:
        """An image the user built FROM this project's worker image (README.md,
        "Your own handler"), with the handler in it: ``uri`` is
        ``<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>`` (the task's
        execution role is granted the pull) or any other registry's public image."""
        check_factory(factory)
        if not uri or any(c.isspace() for c in uri):
            raise FleetOptionsError("handler", f"not an image URI: {uri!r}")
        return cls(factory=factory, image_uri=uri)

    @classmethod
    def built_in(cls, factory: str) -> WorkerHandler:
        """A factory the worker image holds already (the worker's own modules)."""
        return cls(factory=check_factory(factory))

    @classmethod
    def kinesis(cls, stream: kinesis.IStream) -> WorkerHandler:
        """The Kinesis sink (``PutRecords``, one envelope per record, the connection id
        as partition key) writing to ``stream``. The task role gets the stream's
        ``grant_write`` (``PutRecords``, ``PutRecord``, ``ListShards``), and the use of
        its key if it is encrypted with a customer-managed one. The sink is given the
        stream's ARN, which names it in any account and region."""

        def grant(role: iam.IRole) -> None:
            _granted(stream.grant_write(role), role, stream.encryption_key, "Kinesis")

        return cls(
            factory=KINESIS_SINK,
            environment={SINK_STREAM_NAME: stream.stream_arn},
            grant=grant,
            max_message_bytes=max_message_bytes(KINESIS_LIMITS),
        )

    @classmethod
    def firehose(cls, delivery_stream: firehose.IDeliveryStream) -> WorkerHandler:
        """The Firehose sink (``PutRecordBatch``, one envelope and a newline per
        record) writing to ``delivery_stream``, a Direct PUT stream. The task role
        gets ``firehose:PutRecordBatch`` on it and nothing else: the sink makes no other
        call, and Firehose encrypts with its own grant on the key, so a producer needs
        no KMS permission."""
        return cls(
            factory=FIREHOSE_SINK,
            environment={SINK_DELIVERY_STREAM: delivery_stream.delivery_stream_name},
            grant=lambda role: _granted(
                delivery_stream.grant(role, "firehose:PutRecordBatch"), role, None, "Firehose"
            ),
            max_message_bytes=max_message_bytes(FIREHOSE_LIMITS),
        )

    @classmethod
    def sqs_fifo(cls, queue: sqs.IQueue) -> WorkerHandler:
        """The SQS FIFO sink (``SendMessageBatch``, the connection id as message group,
        a hash of the message's name as deduplication id) writing to ``queue``. The
        task role gets the queue's ``grant_send_messages``, and the use of its key if it
        is encrypted with a customer-managed one.

        A queue known not to be FIFO is refused here rather than by every worker at
        start: one of this app (``fifo`` unset) or imported under a name without
        ``.fifo``. A queue imported from a token cannot be told: pass ``fifo=True``
        when importing it, as CDK asks; the workers check the URL when they start."""
        if not queue.fifo and not _fifo_unknowable(queue):
            raise FleetOptionsError(
                "handler",
                f"WorkerHandler.sqs_fifo needs a FIFO queue; {queue.node.path} is a standard "
                "queue (create it with fifo=True, or import it with fifo=True)",
            )

        def grant(role: iam.IRole) -> None:
            _granted(queue.grant_send_messages(role), role, queue.encryption_master_key, "SQS")

        return cls(
            factory=SQS_FIFO_SINK,
            environment={SINK_QUEUE_URL: queue.queue_url},
            grant=grant,
            max_message_bytes=max_message_bytes(SQS_LIMITS),
        )


KEY_WILDCARDS: Final = ("kms:GenerateDataKey*", "kms:ReEncrypt*")
"""What CDK's grants give on a destination's key in wildcard form: cdk-nag's IAM5."""


def _granted(grant: iam.Grant, role: iam.IRole, key: kms.IKey | None, service: str) -> None:
    # A principal of another account (or an imported role whose policy is not ours to
    # change) makes CDK drop the statement quietly; the worker would fail every send.
    grant.assert_success()
    if key is None:
        return
    from aws_cdk import Acknowledgment, Validations

    for action in KEY_WILDCARDS:
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Action::{action}]",
                reason=f"The {service} sink's destination is encrypted with a customer-managed "
                f"key: {service} asks the sender for a data key of it (GenerateDataKey). "
                "CDK's grant gives the GenerateDataKey and ReEncrypt families on that one "
                "key, no other.",
            )
        )


def _fifo_unknowable(queue: sqs.IQueue) -> bool:
    """An imported queue whose name is a token: CDK infers ``fifo`` from the name,
    so False there means "not said", not "standard"."""
    from aws_cdk import Token
    from aws_cdk import aws_sqs as sqs

    return not isinstance(queue, sqs.Queue) and Token.is_unresolved(queue.queue_name)


def top_level_names(directory: Path) -> set[str]:
    """The importable names a directory puts on the path: packages and modules."""
    names = set()
    for entry in directory.iterdir():
        if entry.is_dir() and entry.name.isidentifier():
            names.add(entry.name)
        elif entry.suffix == ".py" and entry.stem.isidentifier():
            names.add(entry.stem)
    return names
