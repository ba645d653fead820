"""The built-in sinks wired by the construct: ``WorkerHandler.kinesis``, ``.firehose``
and ``.sqs_fifo`` set the workers' ``HANDLER`` and the sink's destination variable,
and grant the task role the sink's write and nothing more (the key's use included when
the destination is encrypted with one); and this app's ``sink=kinesis``, which creates
the stream. Every app here is synthesized offline under cdk-nag."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kinesisfirehose as firehose
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks

from stacks.settings import SettingsError, settings_from_context
from tests.stacks.cfn import arn, canonical, grants, of_type, only, role_permissions
from tests.stacks.conftest import Synthesized, cdk_json_context, synthesize
from tests.stacks.test_construct import HOSTS, container_environment
from websocket_fleet import FleetOptionsError, WebSocketFleet, WorkerHandler

pytestmark = pytest.mark.cdk

KINESIS_WRITE = ["kinesis:ListShards", "kinesis:PutRecord", "kinesis:PutRecords"]
KMS_ENCRYPT = ["kms:Encrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]
SQS_SEND = ["sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
KMS_SEND = ["kms:Decrypt", *KMS_ENCRYPT]
FLEET_SERVICES = {"dynamodb", "secretsmanager"}
"""The services the task role uses without a sink (and the start queue, below)."""


def task_role_id(resources: dict[str, Any]) -> str:
    _, task = only(resources, "AWS::ECS::TaskDefinition")
    role_id: str = task["TaskRoleArn"]["Fn::GetAtt"][0]
    return role_id


def start_queue_id(resources: dict[str, Any]) -> str:
    queue_id: str = container_environment({"Resources": resources})["QUEUE_URL"]["Ref"]
    return queue_id


def sink_permissions(resources: dict[str, Any]) -> set[tuple[str, str]]:
    """What the task role may do besides the fleet's own table, start queue and
    secrets."""
    start_queue = canonical(arn(start_queue_id(resources)))
    return {
        (action, resource)
        for action, resource in role_permissions(resources, task_role_id(resources))
        if action.split(":")[0] not in FLEET_SERVICES
        and not (action.startswith("sqs:") and resource == start_queue)
    }


def key_arn(resources: dict[str, Any]) -> dict[str, Any]:
    """The test's own key (the fleet has one of its own, for the alarm topic)."""
    (key_id,) = [k for k in of_type(resources, "AWS::KMS::Key") if k.startswith("Key")]
    return arn(key_id)


class SinkApp:
    """One user app, three stacks, one sink each, cdk-nag applied; synthesized once."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        flags = {k: v for k, v in cdk_json_context().items() if not k.startswith("fleet:")}
        app = cdk.App(context=flags, outdir=str(outdir))

        to_kinesis = cdk.Stack(app, "ToKinesis")
        key = kms.Key(to_kinesis, "Key", enable_key_rotation=True)
        stream = kinesis.Stream(
            to_kinesis,
            "Envelopes",
            stream_mode=kinesis.StreamMode.ON_DEMAND,
            encryption=kinesis.StreamEncryption.KMS,
            encryption_key=key,
        )
        cdk.Validations.of(stream).acknowledge(
            cdk.Acknowledgment(
                id="AwsSolutions-KDS3",
                reason="A customer-managed key on purpose: the test checks its grant.",
            )
        )
        WebSocketFleet(
            to_kinesis,
            "Fleet",
            handler=WorkerHandler.kinesis(stream),
            allowed_upstream_hosts=HOSTS,
            handler_environment={"SINK_MAX_ATTEMPTS": "8"},
        )

        to_firehose = cdk.Stack(app, "ToFirehose")
        delivery = firehose.DeliveryStream.from_delivery_stream_name(
            to_firehose, "Envelopes", "fleet-envelopes"
        )
        WebSocketFleet(
            to_firehose,
            "Fleet",
            handler=WorkerHandler.firehose(delivery),
            allowed_upstream_hosts=HOSTS,
        )

        to_sqs = cdk.Stack(app, "ToSqsFifo")
        queue_key = kms.Key(to_sqs, "Key", enable_key_rotation=True)
        dead_letters = sqs.Queue(
            to_sqs,
            "DeadLetters",
            fifo=True,
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=queue_key,
            enforce_ssl=True,
        )
        cdk.Validations.of(dead_letters).acknowledge(
            cdk.Acknowledgment(id="AwsSolutions-SQS3", reason="The queue of last resort.")
        )
        queue = sqs.Queue(
            to_sqs,
            "Envelopes",
            fifo=True,
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=queue_key,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=5, queue=dead_letters),
        )
        WebSocketFleet(
            to_sqs, "Fleet", handler=WorkerHandler.sqs_fifo(queue), allowed_upstream_hosts=HOSTS
        )

        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        self.assembly = app.synth()

    def resources(self, stack: str) -> dict[str, Any]:
        resources: dict[str, Any] = self.assembly.get_stack_by_name(stack).template["Resources"]
        return resources


@pytest.fixture(scope="module")
def sink_app(tmp_path_factory: pytest.TempPathFactory) -> SinkApp:
    return SinkApp(tmp_path_factory.mktemp("sinks.out"))


def test_every_sink_app_passes_cdk_nag(sink_app: SinkApp) -> None:
    # The synth would have raised on a finding; the report says why not.
    report = json.loads((sink_app.outdir / "validation-report.json").read_text())
    assert [r for r in report["pluginReports"] if r.get("conclusion") == "failure"] == []


def test_kinesis_sets_the_factory_and_the_streams_arn(sink_app: SinkApp) -> None:
    resources = sink_app.resources("ToKinesis")
    stream_id, _ = only(resources, "AWS::Kinesis::Stream")
    env = container_environment({"Resources": resources})
    assert env["HANDLER"] == "worker.sinks.kinesis:factory"
    assert env["SINK_STREAM_NAME"] == arn(stream_id)
    assert env["SINK_MAX_ATTEMPTS"] == "8"
    assert env["MAX_MESSAGE_BYTES"] == str(1024 * 1024 - 1024)


def test_kinesis_grants_the_write_and_the_keys_encryption_only(sink_app: SinkApp) -> None:
    resources = sink_app.resources("ToKinesis")
    stream_id, _ = only(resources, "AWS::Kinesis::Stream")
    assert sink_permissions(resources) == grants(KINESIS_WRITE, arn(stream_id)) | grants(
        KMS_ENCRYPT, key_arn(resources)
    )


def test_firehose_sets_the_factory_and_grants_put_record_batch_only(sink_app: SinkApp) -> None:
    resources = sink_app.resources("ToFirehose")
    env = container_environment({"Resources": resources})
    assert env["HANDLER"] == "worker.sinks.firehose:factory"
    assert env["SINK_DELIVERY_STREAM"] == "fleet-envelopes"
    delivery_stream = {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":firehose:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                ":deliverystream/fleet-envelopes",
            ],
        ]
    }
    assert sink_permissions(resources) == grants(["firehose:PutRecordBatch"], delivery_stream)


def test_sqs_fifo_sets_the_queue_url_and_grants_the_send_with_the_key(sink_app: SinkApp) -> None:
    resources = sink_app.resources("ToSqsFifo")
    (queue_id,) = [k for k in of_type(resources, "AWS::SQS::Queue") if k.startswith("Envelopes")]
    env = container_environment({"Resources": resources})
    assert env["HANDLER"] == "worker.sinks.sqs_fifo:factory"
    assert env["SINK_QUEUE_URL"] == {"Ref": queue_id}
    # the largest message an SQS body carries with its envelope, not the worker's 1 MiB
    assert env["MAX_MESSAGE_BYTES"] == str(256 * 1024 - 1024)
    assert sink_permissions(resources) == grants(SQS_SEND, arn(queue_id)) | grants(
        KMS_SEND, key_arn(resources)
    )


# --- refused at synth ----------------------------------------------------------------------


def test_a_standard_queue_is_refused() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(FleetOptionsError, match="needs a FIFO queue; S/Plain is a standard"):
        WorkerHandler.sqs_fifo(sqs.Queue(stack, "Plain"))
    imported = sqs.Queue.from_queue_arn(stack, "Imported", "arn:aws:sqs:eu-west-1:123456789012:q")
    with pytest.raises(FleetOptionsError, match="needs a FIFO queue"):
        WorkerHandler.sqs_fifo(imported)


def test_a_fifo_queue_imported_by_name_or_from_a_token_is_taken() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    by_name = sqs.Queue.from_queue_arn(
        stack, "ByName", "arn:aws:sqs:eu-west-1:123456789012:envelopes.fifo"
    )
    assert WorkerHandler.sqs_fifo(by_name).factory == "worker.sinks.sqs_fifo:factory"
    # The name is not known at synth: the workers check the URL when they start.
    from_token = sqs.Queue.from_queue_arn(stack, "FromToken", cdk.Fn.import_value("QueueArn"))
    assert WorkerHandler.sqs_fifo(from_token).environment


def test_the_handler_environment_may_not_set_the_sinks_destination_again() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    stream = kinesis.Stream.from_stream_arn(
        stack, "Stream", "arn:aws:kinesis:eu-west-1:123456789012:stream/envelopes"
    )
    with pytest.raises(FleetOptionsError, match="SINK_STREAM_NAME: set by the handler") as refused:
        WebSocketFleet(
            stack,
            "Fleet",
            handler=WorkerHandler.kinesis(stream),
            allowed_upstream_hosts=HOSTS,
            handler_environment={"SINK_STREAM_NAME": "other"},
        )
    assert refused.value.option == "handler_environment"


@pytest.mark.parametrize(("given", "refused"), [("261120", False), ("261121", True)])
def test_a_max_message_bytes_the_sink_cannot_carry_is_refused(given: str, refused: bool) -> None:
    """S5: with the worker's 1 MiB and the SQS sink's 256 KiB, every message between
    the two could never be sent."""
    stack = cdk.Stack(cdk.App(), "S")
    queue = sqs.Queue(stack, "Envelopes", fifo=True)

    def fleet() -> WebSocketFleet:
        return WebSocketFleet(
            stack,
            "Fleet",
            handler=WorkerHandler.sqs_fifo(queue),
            allowed_upstream_hosts=HOSTS,
            worker_settings={"MAX_MESSAGE_BYTES": given},
        )

    if not refused:
        fleet()
        return
    with pytest.raises(FleetOptionsError, match="MAX_MESSAGE_BYTES 261,121 is over") as caught:
        fleet()
    assert caught.value.option == "worker_settings"


# --- this app: sink=kinesis --------------------------------------------------------------


@pytest.fixture(scope="module")
def with_sink(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """This app with ``-c sink=kinesis``, as the CLI passes it (text), cdk-nag applied."""
    context = {**cdk_json_context(), "sink": "kinesis"}
    return synthesize(context, tmp_path_factory.mktemp("sink.out"))


def test_sink_kinesis_creates_an_encrypted_on_demand_stream(with_sink: Synthesized) -> None:
    stream_id, stream = only(with_sink.resources, "AWS::Kinesis::Stream")
    assert stream["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    assert "ShardCount" not in stream
    assert stream["StreamEncryption"] == {"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"}
    assert with_sink.resources[stream_id]["DeletionPolicy"] == "Retain"
    assert with_sink.settings.sink == "kinesis"
    assert with_sink.settings.options.handler is None
    outputs = with_sink.template.to_json()["Outputs"]
    assert outputs["SinkStreamName"]["Value"] == {"Ref": stream_id}
    assert outputs["SinkStreamArn"]["Value"] == arn(stream_id)


def test_sink_kinesis_wires_the_stream_into_the_workers(with_sink: Synthesized) -> None:
    resources = with_sink.resources
    stream_id, _ = only(resources, "AWS::Kinesis::Stream")
    env = container_environment({"Resources": resources})
    assert env["HANDLER"] == "worker.sinks.kinesis:factory"
    assert env["SINK_STREAM_NAME"] == arn(stream_id)
    # The AWS-managed key needs no grant of ours.
    assert sink_permissions(resources) == grants(KINESIS_WRITE, arn(stream_id))
    report = json.loads((with_sink.outdir / "validation-report.json").read_text())
    assert [r for r in report["pluginReports"] if r.get("conclusion") == "failure"] == []


def _settings(**context: Any) -> Any:
    return settings_from_context(cdk.App(context={**cdk_json_context(), **context}).node)


def test_sink_is_read_with_or_without_the_prefix_and_none_turns_it_off() -> None:
    assert _settings(**{"fleet:sink": "kinesis"}).sink == "kinesis"
    assert _settings(sink="none").sink is None
    assert _settings().sink is None


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"sink": "firehose"}, "sink: one of kinesis (or none), got 'firehose'"),
        (
            {"sink": "kinesis", "workerHandler": "worker.delivery:LogHandler"},
            "sink=kinesis sets the workers' handler",
        ),
        ({"sink": "kinesis", "fleet:sink": "none"}, "both set"),
    ],
)
def test_bad_sink_settings_fail_the_synth(context: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        _settings(**context)
