"""This app's context for the handler and the worker settings: ``handlerDir``,
``workerHandler`` and ``workerSettings``, with or without the ``fleet:`` prefix, as
``cdk synth -c key=value`` passes them (text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from stacks.settings import SettingsError, settings_from_context
from tests.stacks.conftest import Synthesized, cdk_json_context, synthesize
from tests.stacks.test_construct import container_environment, handler_dir

pytestmark = pytest.mark.cdk

SETTINGS = '{"HANDLER_ERRORS": "skip", "BALANCE_ROUND_SECONDS": "10"}'


@pytest.fixture(scope="module")
def with_handler(tmp_path_factory: pytest.TempPathFactory) -> tuple[Synthesized, Path]:
    directory = handler_dir(tmp_path_factory.mktemp("handler"))
    context = {
        **cdk_json_context(),
        "workerSettings": SETTINGS,
        "handlerDir": str(directory),
        "workerHandler": "my_sink.sink:factory",
        "handlerEnvironment": '{"SINK_TABLE": "trades"}',
    }
    return synthesize(context, tmp_path_factory.mktemp("handler.out")), directory


def test_worker_settings_and_the_handler_reach_the_task_definition(
    with_handler: tuple[Synthesized, Path],
) -> None:
    synth, _ = with_handler
    env = container_environment({"Resources": synth.resources})
    assert (env["HANDLER_ERRORS"], env["BALANCE_ROUND_SECONDS"]) == ("skip", "10")
    assert env["HANDLER"] == "my_sink.sink:factory"
    assert env["SINK_TABLE"] == "trades"


def test_the_handler_directory_is_staged_into_the_image_context(
    with_handler: tuple[Synthesized, Path],
) -> None:
    synth, directory = with_handler
    manifest = json.loads(next(synth.outdir.glob("*.assets.json")).read_text())
    (image,) = manifest["dockerImages"].values()
    context = synth.outdir / image["source"]["directory"]
    assert (context / "handler" / "my_sink" / "sink.py").exists()
    assert (context / "handler" / "requirements.txt").read_text() == (
        directory / "requirements.txt"
    ).read_text()


def _settings(**context: Any) -> Any:
    return settings_from_context(cdk.App(context={**cdk_json_context(), **context}).node)


def test_the_prefixed_keys_work_too_and_the_two_may_not_disagree() -> None:
    options = _settings(**{"fleet:workerSettings": SETTINGS}).options
    assert options.worker_settings == {"HANDLER_ERRORS": "skip", "BALANCE_ROUND_SECONDS": "10"}
    numbers = _settings(workerSettings='{"BALANCE_ROUND_SECONDS": 10, "BALANCE_TOLERANCE": 0.1}')
    assert numbers.options.worker_settings == {
        "BALANCE_ROUND_SECONDS": "10",
        "BALANCE_TOLERANCE": "0.1",
    }
    with pytest.raises(SettingsError, match="both set"):
        _settings(**{"workerSettings": SETTINGS, "fleet:workerSettings": "{}"})


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"workerSettings": '{"HANDLER_ERRORS": "maybe"}'},
            "workerSettings: HANDLER_ERRORS must be 'retry' or 'skip', got 'maybe'",
        ),
        (
            {"workerSettings": '{"BALANCE_ROUND": "10"}'},
            "workerSettings: not a worker setting: BALANCE_ROUND",
        ),
        ({"workerSettings": '{"QUEUE_URL": "x"}'}, "QUEUE_URL is set by the stack"),
        (
            {"workerSettings": '{"REASSIGN_ON_RELEASE": "false"}'},
            "set by the option reassign_on_release (reassignOnRelease)",
        ),
        ({"workerSettings": "[1]"}, "expected a JSON object"),
        (
            {"handlerEnvironment": '{"LOG_LEVEL": "DEBUG"}'},
            "handlerEnvironment: LOG_LEVEL is a worker setting: give it in worker_settings",
        ),
        ({"handlerDir": "/nonexistent/handler", "workerHandler": "a.b:c"}, "does not exist"),
        ({"handlerDir": "."}, "handlerDir needs workerHandler"),
        ({"workerHandler": "no-colon"}, "workerHandler/handlerDir: factory must look like"),
    ],
)
def test_bad_values_fail_the_synth_with_the_key_and_the_workers_message(
    context: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        _settings(**context)
    assert message in str(refused.value)


def test_a_handler_already_in_the_image_is_named_alone() -> None:
    options = _settings(workerHandler="worker.delivery:LogHandler").options
    assert options.handler is not None
    assert (options.handler.factory, options.handler.directory) == (
        "worker.delivery:LogHandler",
        None,
    )
