"""The worker image, built from the real Dockerfile, run exactly as the synthesized
task definition says against DynamoDB Local, moto and the demo feed: it opens its
session, passes its health check, streams a connection, and drains on SIGTERM within
the stop timeout, exiting 0. A definition the image cannot run fails the run."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from local_stack.clock import wait_until
from local_stack.process_env import local_aws_settings
from scripts.fleet_image import oci, tools
from scripts.fleet_image.build import BuiltImage
from scripts.fleet_image.container import Container, ContainerError
from scripts.fleet_image.task_definition import ContainerSpec, container_spec
from tests.examples.trade_table import create_trade_table
from tests.image.templates import SynthesizedTemplate
from tests.support.fleet import Fleet
from tests.support.timing import scaled
from worker import config as worker_settings

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(scaled(300))]


def run_env(fleet: Fleet, spec: ContainerSpec, **supplied: str) -> dict[str, str]:
    """The definition's variables, the table and queue its ``Ref``s name supplied
    locally, and what the task role and ECS would give: credentials, region, endpoints."""
    values = {
        worker_settings.TABLE_NAME: fleet.table,
        worker_settings.QUEUE_URL: fleet.queue_url,
        **supplied,
    }
    return {**local_aws_settings(fleet.endpoints), **spec.environment_with(values)}


def deliveries(log: str, connection_id: str) -> list[int]:
    """Seqs the default handler logged for the connection (one line per message)."""
    seqs = []
    for line in log.splitlines():
        if line.startswith("{") and '"connection_id"' in line:
            event = json.loads(line)
            if event.get("message") == "message" and event.get("connection_id") == connection_id:
                seqs.append(int(event["seq"]))
    return seqs


def test_the_image_keeps_the_health_check_and_user_the_task_definition_relies_on(
    worker_image: BuiltImage, synthesized: SynthesizedTemplate
) -> None:
    image = oci.ImageConfig.from_inspect(tools.inspect_image(worker_image.name))
    spec = container_spec(synthesized.template)
    assert spec.health_check is not None
    assert image.healthcheck == spec.health_check.command  # --format docker kept it
    assert image.user == "10001"
    assert image.entrypoint == ("python", "-m", "worker")
    assert image.labels["org.opencontainers.image.version"]


def test_the_image_runs_as_the_task_definition_says(
    worker_image: BuiltImage, synthesized: SynthesizedTemplate, fleet: Fleet, tmp_path: Path
) -> None:
    spec = container_spec(synthesized.template)
    # What is checked is what the template says, not what this test assumes.
    assert spec.stop_timeout == 120
    assert spec.memory_mib == 512
    assert spec.health_check is not None
    fleet.start_connection("img-1", fleet.feed("img-1", rate=20))
    env = run_env(fleet, spec)
    with Container(worker_image.name, spec, env=env, log_path=tmp_path / "worker.log") as worker:
        started = time.monotonic()
        worker.start()
        # Exactly the definition's variables and the local plumbing reach the process.
        names = set(worker.environment)
        image_env = {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONPATH"}
        plumbing = set(local_aws_settings(fleet.endpoints)) | {"HOSTNAME", "HOME"}
        assert names == set(spec.environment) | image_env | plumbing
        assert worker.config["process"]["user"]["uid"] == 10001  # type: ignore[index]
        health = worker.wait_healthy()
        assert health.healthy, health.output
        print(f"health check passed {health.seconds:.1f} s after the start")
        wait_until(
            lambda: len(deliveries(worker.log(), "img-1")) >= 10,
            scaled(30),
            "the connection to stream in the container",
        )
        item = fleet.item("img-1")
        assert item.lease_owner is not None
        assert item.lease_owner.startswith(worker.name)  # its hostname: the container's
        limit = Path(f"/sys/fs/cgroup/memory/websocket-fleet/{worker.name}/memory.limit_in_bytes")
        if limit.exists():  # cgroup v1 here; the limit is checked where it can be read
            assert int(limit.read_text()) == 512 << 20
        stopped = worker.stop()
        print(f"up {time.monotonic() - started:.1f} s; SIGTERM to exit: {stopped.seconds:.2f} s")
        assert stopped.exit_code == 0, worker.log_tail()
        assert not stopped.killed
        assert stopped.seconds < spec.stop_timeout
    seqs = deliveries((tmp_path / "worker.log").read_text(), "img-1")
    assert seqs == list(range(1, len(seqs) + 1)), "in order, none lost or repeated"
    released = fleet.item("img-1")
    assert released.lease_owner is None  # drained: released with its final checkpoint
    assert released.last_seq == seqs[-1]


def _changed(template: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The template with the worker's container definition changed (None removes)."""
    changed = copy.deepcopy(template)
    for resource in changed["Resources"].values():
        if resource["Type"] == "AWS::ECS::TaskDefinition":
            definition = resource["Properties"]["ContainerDefinitions"][0]
            for key, value in changes.items():
                if value is None:
                    definition.pop(key, None)
                else:
                    definition[key] = value
    return changed


QUICK_HEALTH = {"Interval": 1, "Timeout": 5, "Retries": 2, "StartPeriod": 0}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing variable", "exited with 2 before its health check passed"),
        ("unknown user", "unable to find user websocket-worker"),
        ("failing health command", "No module named worker.healthz"),
        ("read-only root file system", "unhealthy"),
    ],
)
def test_a_task_definition_the_image_cannot_run_fails_the_run(
    worker_image: BuiltImage,
    synthesized: SynthesizedTemplate,
    fleet: Fleet,
    tmp_path: Path,
    case: str,
    expected: str,
) -> None:
    original = container_spec(synthesized.template)
    health = {**QUICK_HEALTH, "Command": list(original.health_check.command)}  # type: ignore[union-attr]
    if case == "missing variable":
        kept = [e for e in _env_entries(synthesized.template) if e["Name"] != "QUEUE_URL"]
        template = _changed(synthesized.template, Environment=kept)
    elif case == "unknown user":
        template = _changed(synthesized.template, User="websocket-worker")
    elif case == "failing health command":
        health["Command"] = ["CMD", "python", "-m", "worker.healthz"]
        template = _changed(synthesized.template, HealthCheck=health)
    else:
        template = _changed(synthesized.template, ReadonlyRootFilesystem=True, HealthCheck=health)
    spec = container_spec(template)
    env = run_env(fleet, spec)
    outcome = ""
    with Container(worker_image.name, spec, env=env, log_path=tmp_path / "worker.log") as worker:
        try:
            worker.start()
            result = worker.wait_healthy()
            outcome = "healthy" if result.healthy else f"unhealthy: {result.output}"
        except (ContainerError, oci.UserError) as error:
            outcome = str(error)
    assert not outcome.startswith("healthy")
    assert expected in outcome, outcome


def _env_entries(template: dict[str, Any]) -> list[dict[str, Any]]:
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::ECS::TaskDefinition":
            entries: list[dict[str, Any]] = resource["Properties"]["ContainerDefinitions"][0][
                "Environment"
            ]
            return entries
    raise AssertionError("no task definition")


def test_an_image_with_a_handler_directory_runs_its_handler_as_the_task_definition_says(
    handler_image: BuiltImage,
    synthesized_with_handler: SynthesizedTemplate,
    fleet: Fleet,
    tmp_path: Path,
) -> None:
    spec = container_spec(synthesized_with_handler.template)
    assert spec.environment["HANDLER"] == "recorder:factory"
    records = f"records-{tmp_path.name[-8:]}"
    create_trade_table(fleet.ddb, records)  # keyed by connection_id and seq, as it needs
    fleet.start_connection("img-h", fleet.feed("img-h", rate=20))
    env = run_env(fleet, spec, RECORD_TABLE=records)

    def recorded() -> list[int]:
        found = fleet.ddb.query(
            TableName=records,
            KeyConditionExpression="connection_id = :c",
            ExpressionAttributeValues={":c": {"S": "img-h"}},
            ConsistentRead=True,
        )
        return [int(item["seq"]["N"]) for item in found["Items"]]

    with Container(handler_image.name, spec, env=env, log_path=tmp_path / "worker.log") as worker:
        worker.start()
        health = worker.wait_healthy()
        assert health.healthy, health.output
        wait_until(lambda: len(recorded()) >= 10, scaled(30), "the handler to write deliveries")
        stopped = worker.stop()
        assert stopped.exit_code == 0, worker.log_tail()
    seqs = recorded()
    assert seqs == list(range(1, len(seqs) + 1))
    assert fleet.item("img-h").lease_owner is None
