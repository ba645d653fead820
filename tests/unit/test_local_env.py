"""What the local stack's processes are told: where Secrets Manager answers (moto, for
workers), which secret references the router admits, how the demo feed gets its key
(never on its command line), and the plug-in protocols registered for the workers and
the router alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from lambdas.router.settings import ALLOWED_SECRET_PREFIX, RouterSettings
from local_stack import feed, services
from local_stack.fleet import Deployment
from local_stack.options import parse_args
from local_stack.process_env import (
    LOCAL_SECRET_PREFIX,
    Endpoints,
    local_aws_settings,
    router_env,
    worker_env,
)
from local_stack.resources import DEMO_SECRET
from worker.config import WorkerConfig
from wsfleet.secret_refs import check_secret_ref

ENDPOINTS = Endpoints("http://127.0.0.1:8000", "http://127.0.0.1:5000")


def test_secrets_manager_is_the_moto_server():
    settings = local_aws_settings(ENDPOINTS)
    assert settings["AWS_ENDPOINT_URL_SECRETS_MANAGER"] == "http://127.0.0.1:5000"
    assert ENDPOINTS.secrets_manager == ENDPOINTS.sqs


def test_workers_reach_secrets_manager_and_inherit_no_other_endpoint(tmp_path: Path):
    env = worker_env(
        {"AWS_ENDPOINT_URL_SECRETS_MANAGER": "https://elsewhere", "AWS_PROFILE": "prod"},
        endpoints=ENDPOINTS,
        table="t",
        queue_url="q",
        worker_id="w",
        health_file=tmp_path / "h",
    )
    assert env["AWS_ENDPOINT_URL_SECRETS_MANAGER"] == ENDPOINTS.sqs
    assert "AWS_PROFILE" not in env


def test_the_local_router_admits_secrets_under_the_fleets_prefix():
    env = router_env({}, endpoints=ENDPOINTS, table="t", queue_url="q")
    assert env[ALLOWED_SECRET_PREFIX] == LOCAL_SECRET_PREFIX == "websocket-fleet/"
    assert check_secret_ref(DEMO_SECRET, env[ALLOWED_SECRET_PREFIX]) == DEMO_SECRET


def test_the_feeds_key_variable_is_the_feeds_own():
    assert services.FEED_KEY_ENV == feed.KEY_ENV


# --- plug-in protocols: one registry for the workers and the router ------------------------

TICKLINE = "examples.tickline.protocol:factory"


def test_the_command_line_registers_plugin_protocols():
    options = parse_args(
        ["--upstream-protocol", f"tickline={TICKLINE}", "--upstream-protocol", "b=b.m:make"]
    )
    assert options.upstream_protocols == {"tickline": TICKLINE, "b": "b.m:make"}
    assert parse_args([]).upstream_protocols == {}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--upstream-protocol", TICKLINE], "expected NAME=PKG.MOD:FACTORY"),
        (["--upstream-protocol", f"live={TICKLINE}"], "'live' is a built-in protocol"),
        (["--upstream-protocol", "Tick=a.b:c"], "'Tick' is not a protocol name"),
        (["--upstream-protocol", "tick=a.b"], "must look like 'package.module:factory'"),
        (["--upstream-protocol", "t=a.b:c", "--upstream-protocol", "t=d.e:f"], "registered twice"),
    ],
)
def test_a_registration_that_cannot_work_is_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_deployment_gives_the_workers_and_the_router_one_registry(tmp_path: Path):
    deployment = Deployment(
        ENDPOINTS, tmp_path, table="t", queue="q", upstream_protocols={"tickline": TICKLINE}
    )
    try:
        workers = worker_env(
            {"UPSTREAM_PROTOCOLS": '{"stale": "x.y:z"}'},  # the caller's own: not inherited
            endpoints=ENDPOINTS,
            table="t",
            queue_url="q",
            worker_id="w",
            health_file=tmp_path / "h",
            settings=deployment.worker_defaults,
        )
        router = router_env(
            {"UPSTREAM_PROTOCOLS": '{"stale": "x.y:z"}'},
            endpoints=ENDPOINTS,
            table="t",
            queue_url="q",
            upstream_protocols=deployment.upstream_protocols,
        )
    finally:
        deployment.close_clients()
    assert workers["UPSTREAM_PROTOCOLS"] == router["UPSTREAM_PROTOCOLS"]
    assert WorkerConfig.from_env(workers).upstream_protocols == {"tickline": TICKLINE}
    assert RouterSettings.from_env(router).plugin_protocols == {"tickline"}
    plain = router_env({"UPSTREAM_PROTOCOLS": "{}"}, endpoints=ENDPOINTS, table="t", queue_url="q")
    assert "UPSTREAM_PROTOCOLS" not in plain
