"""What the local stack's processes are told: where Secrets Manager answers (moto, for
workers), which secret references the router admits, and how the demo feed gets its
key (never on its command line)."""

from __future__ import annotations

from pathlib import Path

from lambdas.router.settings import ALLOWED_SECRET_PREFIX
from local_stack import feed, services
from local_stack.process_env import (
    LOCAL_SECRET_PREFIX,
    Endpoints,
    local_aws_settings,
    router_env,
    worker_env,
)
from local_stack.resources import DEMO_SECRET
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
