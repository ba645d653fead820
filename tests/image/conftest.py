"""The worker image, built once per session from the real Dockerfile on the local
stand-in base (cached outside the repository), and the synthesized template whose task
definition says how to run it.

Without buildah, runc or debootstrap these tests skip, saying why, unless
``WSFLEET_REQUIRE_IMAGE_TOOLS=1`` (scripts/test.sh sets it after installing them):
then a missing tool fails them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.fleet_image import base, build, settings, tools
from tests.image.templates import SynthesizedTemplate, synthesize_template

REQUIRE_ENV = "WSFLEET_REQUIRE_IMAGE_TOOLS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "image: builds the worker image (buildah) and runs it (runc)"
    )


@pytest.fixture(scope="session")
def image_tools() -> None:
    why = None
    missing = tools.missing_tools()
    if missing:
        why = f"{', '.join(missing)} not installed (scripts/image-tools.sh installs them)"
    elif os.geteuid() != 0:
        why = "buildah and runc run rootful here: not root"
    if why is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {why}")
        pytest.skip(why)
    made = base.ensure()
    print(
        f"FROM is the local stand-in {settings.STANDIN_IMAGE} (Debian bookworm's Python "
        f"3.11 from the distribution's packages, not the official python image)"
        + ("; made now" if made else "")
    )


@pytest.fixture(scope="session")
def worker_image(image_tools: None) -> build.BuiltImage:
    built = build.build(tag="localhost/websocket-fleet/worker:test")
    print(f"image built in {built.seconds:.1f} s on {built.base}")
    return built


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedTemplate:
    return synthesize_template(tmp_path_factory.mktemp("cdk.out"))


HANDLER_DIR_FILES = {
    "recorder/__init__.py": '''\
"""Writes each delivery to the DynamoDB table RECORD_TABLE names."""

import os

import boto3
import cachetools


class Recorder:
    def __init__(self, table):
        self._table = table
        self._client = boto3.client("dynamodb")
        self._seen = cachetools.LRUCache(maxsize=100)

    async def handle(self, delivery):
        self._client.put_item(
            TableName=self._table,
            Item={
                "connection_id": {"S": delivery.connection_id},
                "seq": {"N": str(delivery.seq)},
                "worker_id": {"S": delivery.worker_id},
            },
        )


def factory():
    return Recorder(os.environ["RECORD_TABLE"])
''',
    # A requirement of its own: the build installs it next to the worker's lock.
    "requirements.txt": "cachetools==7.2.0\n",
}


@pytest.fixture(scope="session")
def handler_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("handler-dir")
    for name, text in HANDLER_DIR_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="session")
def handler_image(image_tools: None, handler_dir: Path) -> build.BuiltImage:
    built = build.build(
        handler_dir=handler_dir, tag="localhost/websocket-fleet/worker:test-handler"
    )
    print(f"image with a handler directory built in {built.seconds:.1f} s")
    return built


@pytest.fixture(scope="session")
def synthesized_with_handler(
    tmp_path_factory: pytest.TempPathFactory, handler_dir: Path
) -> SynthesizedTemplate:
    return synthesize_template(
        tmp_path_factory.mktemp("cdk.out-handler"),
        {
            "handlerDir": str(handler_dir),
            "workerHandler": "recorder:factory",
            "handlerEnvironment": {"RECORD_TABLE": "records"},
        },
    )
