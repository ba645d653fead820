"""The router's Lambda asset from the synthesized template, run as Lambda would: on a
virtualenv of the runtime's Python holding only what the runtime and the pinned
Powertools layer provide, the asset first on the path, the function's own variables;
it answers an HTTP API event and an EventBridge event against DynamoDB Local and moto.
An import the asset lacks fails."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from local_stack.process_env import Endpoints, local_aws_settings
from scripts.fleet_image import lambda_asset
from tests.image.templates import SynthesizedTemplate, synthesize_template
from tests.router.fixtures import load_event
from tests.support.timing import scaled
from wsfleet.item_io import get_connection

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(300))]

HANDLER = "lambdas.router.main.handler"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedTemplate:
    return synthesize_template(tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="module")
def function(synthesized: SynthesizedTemplate) -> lambda_asset.FunctionSpec:
    return lambda_asset.function_spec(synthesized.template, synthesized.outdir, HANDLER)


@pytest.fixture(scope="module")
def runtime_python(function: lambda_asset.FunctionSpec) -> Path:
    try:
        interpreter = lambda_asset.find_python(function.python_version)
    except lambda_asset.LambdaAssetError as error:
        pytest.fail(str(error))  # scripts/test.sh runs where pyenv has it: never a skip
    print(f"runtime {function.runtime}: {interpreter}")
    return lambda_asset.runtime_venv(function.python_version, lambda_asset.runtime_requirements())


def lambda_environment(function, table: str, queue_url: str, dynamodb: str, moto: str):
    own = function.environment_with({"TABLE_NAME": table, "QUEUE_URL": queue_url})
    return lambda_asset.lambda_env(function, own, local_aws_settings(Endpoints(dynamodb, moto)))


def test_the_runtime_holds_only_what_the_runtime_and_the_layer_provide(
    function: lambda_asset.FunctionSpec, runtime_python: Path
) -> None:
    assert function.runtime == "python3.12"
    version = json.loads(
        subprocess.run(
            [str(runtime_python), "-c", "import json,sys; print(json.dumps(sys.version_info[:2]))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert version == [3, 12]
    found = lambda_asset.installed(runtime_python)
    assert {"boto3", "botocore", "aws-lambda-powertools", "pydantic"} <= found
    assert not found & {"websockets", "orjson", "uvloop", "aws-cdk-lib", "websocket-fleet", "moto"}


def test_the_asset_answers_an_http_api_and_an_eventbridge_event(
    function: lambda_asset.FunctionSpec,
    runtime_python: Path,
    ddb,
    table: str,
    queues,
    dynamodb_endpoint: str,
    moto_endpoint: str,
    sqs,
) -> None:
    # The template's own settings: wss only, upstreams under *.example.com.
    assert function.environment["ALLOW_INSECURE_WS"] == "false"
    env = lambda_environment(function, table, queues.queue_url, dynamodb_endpoint, moto_endpoint)
    get = load_event("get_found")  # GET /connections/feed-1
    answers = lambda_asset.invoke(
        runtime_python,
        function,
        env,
        [load_event("post_create"), load_event("eventbridge_start"), get],
        timeout=scaled(60),
    )
    created, started, got = answers
    assert created.ok, created.result
    assert created.result["statusCode"] == 201, created.result
    assert started.ok, started.result
    assert got.result["statusCode"] == 200, got.result
    assert json.loads(got.result["body"])["connection_id"] == "feed-1"
    for connection_id in ("feed-1", "feed-eb"):
        item = get_connection(ddb, table, connection_id)
        assert item is not None, connection_id
        assert item.desired_state == "STARTED"
    hints = sqs.receive_message(
        QueueUrl=queues.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
    )
    assert len(hints.get("Messages", [])) == 2


def test_an_import_the_asset_lacks_fails_the_run(
    function: lambda_asset.FunctionSpec,
    runtime_python: Path,
    tmp_path: Path,
    table: str,
    queues,
    dynamodb_endpoint: str,
    moto_endpoint: str,
) -> None:
    """``websockets`` is in the project's own environment, not in the runtime's: a router
    module importing it passes every in-process test and fails here."""
    broken_dir = tmp_path / "asset"
    shutil.copytree(function.asset_dir, broken_dir)
    views = broken_dir / "lambdas" / "router" / "views.py"
    source = views.read_text()
    future = "from __future__ import annotations\n"
    views.write_text(source.replace(future, future + "import websockets\n", 1))
    broken = lambda_asset.FunctionSpec(
        function.logical_id,
        function.handler,
        function.runtime,
        broken_dir,
        function.environment,
        function.memory_mb,
        function.timeout_s,
    )
    env = lambda_environment(broken, table, queues.queue_url, dynamodb_endpoint, moto_endpoint)
    (answer,) = lambda_asset.invoke(runtime_python, broken, env, [load_event("post_create")])
    assert not answer.ok
    assert answer.result["errorType"] == "ModuleNotFoundError"
    assert "websockets" in answer.result["errorMessage"]
