"""The construct as a user's CDK app uses it: a handler directory built into the image,
any worker setting deployed, an image of the user's own, every option validated when
the construct is made, and cdk-nag satisfied."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from tests.stacks.cfn import of_type, only
from tests.stacks.conftest import cdk_json_context
from websocket_fleet import FleetOptions, FleetOptionsError, WebSocketFleet, WorkerHandler
from wsfleet.version import VERSION

pytestmark = pytest.mark.cdk

HOSTS = ["*.feeds.example.com"]
ECR_IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/acme/fleet-worker:2.1.0"


def handler_dir(root: Path, requirements: str | None = "simplejson==3.20.1\n") -> Path:
    """A user's handler directory: a package, a module of its own, requirements."""
    directory = root / "handler"
    (directory / "my_sink").mkdir(parents=True)
    (directory / "my_sink" / "__init__.py").write_text("")
    (directory / "my_sink" / "sink.py").write_text(
        "class Sink:\n    async def handle(self, delivery):\n        pass\n\n\n"
        "def factory():\n    return Sink()\n"
    )
    (directory / "my_sink" / "__pycache__").mkdir()
    (directory / "my_sink" / "__pycache__" / "sink.cpython-311.pyc").write_bytes(b"\0")
    if requirements is not None:
        (directory / "requirements.txt").write_text(requirements)
    return directory


def container_environment(template: dict[str, Any]) -> dict[str, Any]:
    _, task = only(template["Resources"], "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    return {e["Name"]: e["Value"] for e in container["Environment"]}


class UserApp:
    """One app with two stacks, synthesized once, cdk-nag applied as a user would."""

    def __init__(self, root: Path) -> None:
        self.handler = handler_dir(root)
        self.outdir = root / "cdk.out"
        # The feature flags of cdk.json, as a user's `cdk init` app has them.
        flags = {k: v for k, v in cdk_json_context().items() if not k.startswith("fleet:")}
        app = cdk.App(context=flags, outdir=str(self.outdir))
        built = cdk.Stack(app, "MyFleet")
        WebSocketFleet(
            built,
            "Fleet",
            handler=WorkerHandler.from_directory(self.handler, factory="my_sink.sink:factory"),
            allowed_upstream_hosts=HOSTS,
            worker_settings={"HANDLER_ERRORS": "skip", "BALANCE_ROUND_SECONDS": "10"},
        )
        imaged = cdk.Stack(app, "TheirImage")
        WebSocketFleet(
            imaged,
            "Fleet",
            handler=WorkerHandler.from_image(ECR_IMAGE, factory="acme.sink:factory"),
            allowed_upstream_hosts=HOSTS,
            min_tasks=1,
            dev=True,
        )
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        self.assembly = app.synth()

    def template(self, stack: str) -> dict[str, Any]:
        template: dict[str, Any] = self.assembly.get_stack_by_name(stack).template
        return template

    def image_context(self) -> Path:
        manifest = json.loads((self.outdir / "MyFleet.assets.json").read_text())
        (image,) = manifest["dockerImages"].values()
        assert image["source"]["dockerFile"] == "worker/Dockerfile"
        assert image["source"]["dockerBuildArgs"] == {"WEBSOCKET_FLEET_VERSION": VERSION}
        return self.outdir / image["source"]["directory"]


@pytest.fixture(scope="module")
def user_app(tmp_path_factory: pytest.TempPathFactory) -> UserApp:
    return UserApp(tmp_path_factory.mktemp("user-app"))


def test_the_worker_runs_the_users_handler_with_every_setting_given(user_app: UserApp) -> None:
    env = container_environment(user_app.template("MyFleet"))
    assert env["HANDLER"] == "my_sink.sink:factory"
    assert (env["HANDLER_ERRORS"], env["BALANCE_ROUND_SECONDS"]) == ("skip", "10")
    assert env["LEASE_SECONDS"] == "2.2"
    assert "WORKER_ID" not in env


def test_the_staged_image_context_holds_the_worker_the_handler_and_its_requirements(
    user_app: UserApp,
) -> None:
    context = user_app.image_context()
    assert {p.name for p in context.iterdir()} == {"worker", "wsfleet", "handler"}
    handler = context / "handler"
    assert (handler / "my_sink" / "sink.py").read_text() == (
        user_app.handler / "my_sink" / "sink.py"
    ).read_text()
    assert (handler / "requirements.txt").read_text() == "simplejson==3.20.1\n"
    assert not list(context.rglob("__pycache__"))
    dockerfile = (context / "worker" / "Dockerfile").read_text()
    assert "COPY handler/requirements.txt handler/requirements.txt" in dockerfile
    assert "-r worker/requirements.txt -r handler/requirements.txt" in dockerfile
    assert "COPY handler/ handler/" in dockerfile


def test_an_ecr_image_of_the_users_is_pulled_with_a_grant_and_runs_their_handler(
    user_app: UserApp,
) -> None:
    template = user_app.template("TheirImage")
    _, task = only(template["Resources"], "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    assert json.dumps(container["Image"]).count("acme/fleet-worker") == 1
    assert "2.1.0" in json.dumps(container["Image"])
    assert container_environment(template)["HANDLER"] == "acme.sink:factory"
    Template.from_json(template).has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": Match.array_with(["ecr:BatchGetImage"]),
                                "Resource": Match.string_like_regexp(
                                    "repository/acme/fleet-worker"
                                ),
                            }
                        )
                    ]
                )
            }
        },
    )
    manifest = json.loads((user_app.outdir / "TheirImage.assets.json").read_text())
    assert manifest.get("dockerImages", {}) == {}


def test_resource_ids_are_under_the_constructs_id(user_app: UserApp) -> None:
    resources = user_app.template("MyFleet")["Resources"]
    table_id, _ = only(resources, "AWS::DynamoDB::Table")
    assert table_id.startswith("FleetConnectionsTable")
    assert of_type(resources, "AWS::CloudWatch::Dashboard")


# --- options refused when the construct is made ----------------------------------------


def make(**options: Any) -> WebSocketFleet:
    stack = cdk.Stack(cdk.App(), "S")
    options.setdefault("allowed_upstream_hosts", HOSTS)
    return WebSocketFleet(stack, "Fleet", **options)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"HANDLER_ERRORS": "maybe"}, "HANDLER_ERRORS must be 'retry' or 'skip', got 'maybe'"),
        ({"BALANCE_ROUND_SECONDS": "-1"}, "BALANCE_ROUND_SECONDS must be > 0 (0: off), got -1.0"),
        ({"SQS_WAIT_SECONDS": "30"}, "SQS_WAIT_SECONDS must be 0..20"),
        ({"HEARTBEAT_SECONDS": "2"}, "invalid lease timing"),
        ({"HANDLER_ERORS": "skip"}, "not a worker setting: HANDLER_ERORS (the worker reads"),
        ({"TABLE_NAME": "other"}, "TABLE_NAME is set by the stack"),
        ({"WORKER_ID": "w-1"}, "WORKER_ID is set by the stack"),
        ({"MAX_CONNECTIONS": "10"}, "MAX_CONNECTIONS is set by the option max_connections"),
        ({"HANDLER": "x.y:z"}, "HANDLER is set by the option handler"),
        ({"LOG_LEVEL": 10}, "text values"),
    ],
)
def test_worker_settings_are_checked_by_the_workers_own_rules(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(FleetOptionsError, match=re.escape(message)) as refused:
        make(worker_settings=settings)
    assert refused.value.option == "worker_settings"


def test_a_handler_requirement_that_contradicts_a_worker_pin_names_both(tmp_path: Path) -> None:
    directory = handler_dir(tmp_path, requirements="requests==2.32.3\nboto3==1.30.0\n")
    with pytest.raises(FleetOptionsError) as refused:
        WorkerHandler.from_directory(directory, "my_sink.sink:factory")
    message = str(refused.value)
    assert "'boto3==1.30.0'" in message
    assert f"{directory / 'requirements.txt'}:2" in message
    assert re.search(r"the worker's pin 'boto3==\d+\.\d+\.\d+'", message)
    # A range the pin satisfies is fine.
    (directory / "requirements.txt").write_text("boto3>=1.40,<2\n")
    assert WorkerHandler.from_directory(directory, "my_sink.sink:factory").directory == directory


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("my_sink.sink", "must look like 'package.module:factory'"),
        ("other.sink:factory", "has no package other/ or module other.py"),
    ],
)
def test_a_handler_directory_must_hold_the_factorys_package(
    tmp_path: Path, factory: str, message: str
) -> None:
    with pytest.raises(FleetOptionsError, match=message):
        WorkerHandler.from_directory(handler_dir(tmp_path), factory)


def test_a_handler_directory_may_not_shadow_the_worker_or_the_standard_library(
    tmp_path: Path,
) -> None:
    directory = handler_dir(tmp_path)
    (directory / "json.py").write_text("")
    (directory / "worker").mkdir()
    with pytest.raises(FleetOptionsError, match="holds json, worker"):
        WorkerHandler.from_directory(directory, "my_sink.sink:factory")


# --- plug-in protocols: one registry for the workers and the router -------------------------

REGISTRY = {"tickline": "tickline_plugin.protocol:factory", "acme-feed": "acme.feed:make"}


def router_environment(template: dict[str, Any]) -> dict[str, Any]:
    (function,) = [
        f["Properties"]
        for f in of_type(template["Resources"], "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    variables: dict[str, Any] = function["Environment"]["Variables"]
    return variables


def test_the_protocol_registry_reaches_the_workers_and_the_router() -> None:
    fleet = make(
        upstream_protocols=REGISTRY,
        worker_settings={"UPSTREAM_PROTOCOL": "tickline"},
        handler=WorkerHandler.from_image(ECR_IMAGE, factory="acme.sink:factory"),
    )
    template = Template.from_stack(cdk.Stack.of(fleet)).to_json()
    registered = '{"acme-feed":"acme.feed:make","tickline":"tickline_plugin.protocol:factory"}'
    workers = container_environment(template)
    assert workers["UPSTREAM_PROTOCOLS"] == registered
    assert workers["UPSTREAM_PROTOCOL"] == "tickline"
    assert router_environment(template)["UPSTREAM_PROTOCOLS"] == registered


def test_without_plugins_neither_gets_the_setting(user_app: UserApp) -> None:
    template = user_app.template("MyFleet")
    assert "UPSTREAM_PROTOCOLS" not in container_environment(template)
    assert "UPSTREAM_PROTOCOLS" not in router_environment(template)


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ({"Tickline": "a.b:c"}, "'Tickline' is not a protocol name"),
        ({"tick_line": "a.b:c"}, "'tick_line' is not a protocol name"),
        ({"": "a.b:c"}, "'' is not a protocol name"),
        ({"json-field": "a.b:c"}, "'json-field' is a built-in protocol"),
        ({"tickline": "tickline_plugin.protocol"}, "must look like 'package.module:factory'"),
        ({"tickline": "tickline-plugin:factory"}, "must look like 'package.module:factory'"),
        ({"tickline": None}, "must look like 'package.module:factory', got None"),
        ({3: "a.b:c"}, "3 is not a protocol name"),
    ],
)
def test_a_registry_that_cannot_work_is_refused_at_synth(registry: Any, message: str) -> None:
    with pytest.raises(FleetOptionsError, match=re.escape(message)) as refused:
        make(upstream_protocols=registry)
    assert refused.value.option == "upstream_protocols"


def test_the_registry_is_set_by_its_option_only_and_the_default_must_be_in_it() -> None:
    with pytest.raises(FleetOptionsError, match="set by the option upstream_protocols") as owned:
        make(worker_settings={"UPSTREAM_PROTOCOLS": '{"tickline": "a.b:c"}'})
    assert owned.value.option == "worker_settings"
    with pytest.raises(FleetOptionsError, match=re.escape("must be one of json-seq (those")):
        make(worker_settings={"UPSTREAM_PROTOCOL": "tickline"})


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"allowed_upstream_hosts": []}, "allowed_upstream_hosts"),
        ({"min_tasks": 5, "max_tasks": 4}, "min_tasks"),
        ({"lease_seconds": 1}, "lease_seconds"),
        ({"event_bus_name": "default"}, "event_bus_name"),
        ({"task_memory_mib": 300}, "task_memory_mib"),
        ({"allowed_secret_prefix": "feeds/*"}, "allowed_secret_prefix"),
        ({"dashboard_name": "has space"}, "dashboard_name"),
    ],
)
def test_options_are_validated_as_the_context_keys_are(
    options: dict[str, Any], option: str
) -> None:
    with pytest.raises(FleetOptionsError) as refused:
        make(**options)
    assert refused.value.option == option


def test_the_constructs_keyword_arguments_are_the_options_with_their_defaults() -> None:
    parameters = inspect.signature(WebSocketFleet.__init__).parameters
    keywords = {name: p.default for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert list(keywords) == [f.name for f in fields(FleetOptions)]
    defaults = FleetOptions()
    for f in fields(FleetOptions):
        if f.name == "allowed_upstream_hosts":
            assert keywords[f.name] is inspect.Parameter.empty
            continue
        expected = getattr(defaults, f.name)
        given = keywords[f.name]
        assert (
            given == expected
            or (given is None and f.default is MISSING)
            or (given is None and f.name == "provisioned_capacity")
            or (given == () and expected == ())
        ), f.name
