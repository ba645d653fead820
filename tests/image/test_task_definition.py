"""How a container definition is read and turned into a runtime spec, and the lock,
checked without building or running anything."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.fleet_image import lock, oci
from scripts.fleet_image.__main__ import container_env, pin_from_line
from scripts.fleet_image.task_definition import (
    HealthCheck,
    TaskDefinitionError,
    container_spec,
)

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE: dict[str, Any] = {
    "Resources": {
        "Task": {
            "Type": "AWS::ECS::TaskDefinition",
            "Properties": {
                "Family": "fleet",
                "Memory": "512",
                "ContainerDefinitions": [
                    {
                        "Name": "worker",
                        "Environment": [
                            {"Name": "TABLE_NAME", "Value": {"Ref": "Table"}},
                            {"Name": "LEASE_SECONDS", "Value": "2.2"},
                        ],
                        "HealthCheck": {
                            "Command": ["CMD", "python", "-m", "worker.health"],
                            "Interval": 15,
                            "Retries": 3,
                            "StartPeriod": 30,
                            "Timeout": 5,
                        },
                        "StopTimeout": 120,
                        "Essential": True,
                    }
                ],
            },
        }
    }
}
PASSWD = "root:x:0:0:root:/root:/bin/bash\nfleet:x:10001:10001::/home/fleet:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nfleet:x:10001:\naudio:x:29:fleet\n"
IMAGE = oci.ImageConfig(
    entrypoint=("python", "-m", "worker"),
    cmd=(),
    env=("PATH=/usr/bin", "PYTHONPATH=/app/handler"),
    user="10001",
    working_dir="/app",
    healthcheck=("CMD", "python", "-m", "worker.health"),
    labels={},
)


def test_a_container_definition_is_read_as_ecs_reads_it() -> None:
    spec = container_spec(TEMPLATE)
    assert spec.entry_point is None
    assert spec.command is None
    assert spec.user is None
    assert spec.stop_timeout == 120
    assert spec.memory_mib == 512  # the task's, as Fargate gives a container without its own
    assert not spec.readonly_root
    assert spec.health_check == HealthCheck(("CMD", "python", "-m", "worker.health"), 15, 5, 3, 30)
    assert spec.health_check.argv() == ["python", "-m", "worker.health"]
    assert spec.health_check.deadline == 30 + 15 * 3 + 5
    assert spec.environment_with({"TABLE_NAME": "t"}) == {"TABLE_NAME": "t", "LEASE_SECONDS": "2.2"}


def test_a_variable_left_to_cloudformation_must_be_supplied() -> None:
    with pytest.raises(TaskDefinitionError, match=r"TABLE_NAME \(\{\"Ref\": \"Table\"\}\)"):
        container_spec(TEMPLATE).environment_with({})


def test_no_such_container_is_an_error() -> None:
    with pytest.raises(TaskDefinitionError, match="found 0"):
        container_spec(TEMPLATE, "sidecar")


def test_a_shell_health_check_runs_through_sh() -> None:
    check = HealthCheck(("CMD-SHELL", "test -f /tmp/x"), 5, 2, 1, 0)
    assert check.argv() == ["/bin/sh", "-c", "test -f /tmp/x"]


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("fleet", (10001, 10001, (29,))),
        ("10001", (10001, 10001, (29,))),
        ("fleet:root", (10001, 0, (29,))),
        ("4242", (4242, 0, ())),  # a number need not be listed, as with Docker
        ("", (0, 0, ())),
    ],
)
def test_users_resolve_against_the_images_files(
    user: str, expected: tuple[int, int, tuple[int, ...]]
) -> None:
    identity = oci.resolve_user(user, PASSWD, GROUP)
    assert (identity.uid, identity.gid, identity.additional_gids) == expected


@pytest.mark.parametrize("user", ["worker", "fleet:nogroup"])
def test_a_name_the_image_lacks_fails(user: str) -> None:
    with pytest.raises(oci.UserError, match="unable to find"):
        oci.resolve_user(user, PASSWD, GROUP)


def test_the_runtime_spec_follows_the_definition() -> None:
    raw = copy.deepcopy(TEMPLATE)
    definition = raw["Resources"]["Task"]["Properties"]["ContainerDefinitions"][0]
    definition.update(ReadonlyRootFilesystem=True, Command=["--verbose"], User="fleet")
    spec = container_spec(raw)
    identity = oci.resolve_user("fleet", PASSWD, GROUP)
    env = oci.environment(IMAGE, identity, "host-1", {"TABLE_NAME": "t"})
    config = oci.runtime_spec(
        image=IMAGE,
        spec=spec,
        identity=identity,
        rootfs="/r",
        env=env,
        hostname="host-1",
        max_rlimit=20000,
    )
    process = config["process"]
    assert process["args"] == ["python", "-m", "worker", "--verbose"]
    assert process["user"] == {"uid": 10001, "gid": 10001, "additionalGids": [29]}
    assert process["cwd"] == "/app"
    assert process["capabilities"]["effective"] == []
    assert {"type": "RLIMIT_NOFILE", "soft": 20000, "hard": 20000} in process["rlimits"]
    assert "PYTHONPATH=/app/handler" in process["env"]
    assert "TABLE_NAME=t" in process["env"]
    assert "HOME=/home/fleet" in process["env"]
    assert "HOSTNAME=host-1" in process["env"]
    assert config["root"] == {"path": "/r", "readonly": True}
    assert config["linux"]["resources"]["memory"] == {"limit": 512 << 20}
    assert "network" not in {ns["type"] for ns in config["linux"]["namespaces"]}


def test_an_entry_point_clears_the_images_cmd() -> None:
    image = oci.ImageConfig(("tini",), ("serve",), (), "", "/", None, {})
    raw = copy.deepcopy(TEMPLATE)
    raw["Resources"]["Task"]["Properties"]["ContainerDefinitions"][0]["EntryPoint"] = ["python"]
    assert oci.argv(image, container_spec(raw)) == ["python"]
    assert oci.argv(image, container_spec(TEMPLATE)) == ["tini", "serve"]


def test_the_lock_holds_every_pin_with_hashes() -> None:
    pins, locked = lock.PINS.read_text(), lock.LOCK.read_text()
    assert lock.pin_mismatches(pins, locked) == []
    entries = lock.lock_entries(locked)
    assert set(lock.pin_entries(pins)) < set(entries), "transitive dependencies are locked too"
    assert all(hashes for _, _, hashes in entries.values())


def test_a_pin_the_lock_does_not_hold_is_found() -> None:
    pins = lock.PINS.read_text().replace("websockets==17.4", "websockets==17.5")
    assert lock.pin_mismatches(pins, lock.LOCK.read_text()) == [
        "websockets is pinned at 17.5 but locked at 17.4"
    ]
    unhashed = "six==1.17.0\n"
    assert lock.pin_mismatches("six==1.17.0\n", unhashed) == ["six has no hash"]


def test_pinning_the_base_keeps_the_tag() -> None:
    digest = "sha256:" + "ab" * 32
    text = "# x\nFROM public.ecr.aws/docker/library/python:3.11-slim\nRUN true\n"
    pinned = pin_from_line(text, digest)
    assert f"FROM public.ecr.aws/docker/library/python:3.11-slim@{digest}\n" in pinned
    again = pin_from_line(pinned, "sha256:" + "cd" * 32)
    assert again.count("@sha256:") == 1
    assert "cd" * 32 in again


def test_hadolint_passes_on_the_dockerfile() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    done = subprocess.run(
        [str(hadolint), str(ROOT / "worker" / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_shell_form_entrypoint(tmp_path: Path) -> None:
    """The linter is really run: a Dockerfile it must refuse is refused."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nENTRYPOINT python -m worker\n")
    hadolint = Path(sys.executable).with_name("hadolint")
    done = subprocess.run([str(hadolint), str(bad)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "DL3025" in done.stdout
    assert "DL3013" in done.stdout


def test_a_local_workers_container_gets_only_worker_and_aws_variables() -> None:
    env = {
        "TABLE_NAME": "t",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
        "PATH": "/host/bin",
        "PYTHONPATH": "/repo",
        "HOME": "/root",
        "MY_TABLE": "x",
        "SINK_STREAM_NAME": "s",
    }
    assert container_env(env, ["MY_TABLE"]) == {
        "TABLE_NAME": "t",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
        "MY_TABLE": "x",
        "SINK_STREAM_NAME": "s",
    }
