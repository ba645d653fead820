"""``fleetctl check-handler`` for real: throwaway virtualenvs with the worker's pins
(pip, from the package index), the example handler of examples/trade_store writing to
DynamoDB Local, and handlers that fail in the ways people's do, each said in words."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.cli import main
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION
from tests.examples.trade_table import create_trade_table
from tests.support.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trade_store" / "handler"
FACTORY = "trade_store.sink:factory"
TRADE = {"symbol": "BTC-USD", "price": "64211.37", "size": "0.4182", "ts": 1767225600600}


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kept for the module: one virtualenv per set of requirements."""
    return tmp_path_factory.mktemp("venvs")


@pytest.fixture
def trade_table(ddb, monkeypatch: pytest.MonkeyPatch, dynamodb_endpoint: str) -> Iterator[str]:
    """A table of the example's shape on DynamoDB Local, and the environment the probe
    inherits pointing at it."""
    name = "trades-check"
    create_trade_table(ddb, name)
    for variable, value in {
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint,
        "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS,
        "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS,
        "AWS_DEFAULT_REGION": LOCAL_REGION,
        "TRADE_TABLE": name,
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield name
    ddb.delete_table(TableName=name)


def check(directory: Path, factory: str, venv: Path, *options: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(
        ["check-handler", str(directory), factory, "--venv", str(venv), *options], stdout=out
    )
    return code, out.getvalue()


def copy_of_example(root: Path, *, requirements: bool) -> Path:
    directory = root / "handler"
    shutil.copytree(EXAMPLE, directory, ignore=shutil.ignore_patterns("__pycache__"))
    if not requirements:
        (directory / "requirements.txt").unlink()
    return directory


def test_the_example_handler_stores_the_sample_trades(venvs: Path, ddb, trade_table: str) -> None:
    code, said = check(EXAMPLE, FACTORY, venvs / "example", "--payload", json.dumps(TRADE))
    assert code == 0, said
    assert "virtualenv: ok: built" in said
    assert "handler: ok: async handle_batch(deliveries): a batch handler" in said
    assert "delivery: ok: handle_batch returned for a batch of 2 sample deliveries" in said
    assert said.rstrip().endswith("ready to deploy")
    stored = ddb.scan(TableName=trade_table)["Items"]
    assert sorted((i["connection_id"]["S"], int(i["seq"]["N"])) for i in stored) == [
        ("check-handler", 1),
        ("check-handler", 2),
    ]
    assert {i["price"]["N"] for i in stored} == {"64211.37"}


def test_an_exception_of_the_handler_is_reported_with_where_it_was_raised(
    venvs: Path, trade_table: str
) -> None:
    """The default sample payload is not a trade: pydantic refuses it. The virtualenv
    of the first test is reused (same requirements)."""
    code, said = check(EXAMPLE, FACTORY, venvs / "example")
    assert code == 1
    assert "virtualenv: ok: reused" in said
    assert (
        "delivery: failed: handle_batch raised on a batch of 2 sample deliveries: "
        "ValidationError (at trade_store/sink.py:"
    ) in said
    assert "): 4 validation errors for Trade\n    symbol\n" in said
    assert said.rstrip().endswith("failed")


def test_a_factory_that_fails_is_reported(venvs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRADE_TABLE", raising=False)
    code, said = check(EXAMPLE, FACTORY, venvs / "example")
    assert code == 1
    assert ("factory: failed: factory() raised RuntimeError (at trade_store/sink.py:") in said
    assert "): TRADE_TABLE is not set: the DynamoDB table the trades go to" in said


def test_a_missing_dependency_is_named(venvs: Path, tmp_path: Path) -> None:
    directory = copy_of_example(tmp_path, requirements=False)
    code, said = check(directory, FACTORY, venvs / "pins-only")
    assert code == 1
    assert (
        "import: failed: missing dependency: trade_store.sink imports 'pydantic', which is "
        "not installed: add the package that provides it to the handler's requirements.txt"
    ) in said
    assert "(at trade_model/__init__.py:" in said


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "def factory(table: str, retries: int = 3) -> None:\n    return None\n",
            "factory: failed: wrong signature: the worker calls factory() with no arguments, "
            "but bad_sink.factory(table, retries=3) needs some",
        ),
        (
            "class Sink:\n    async def handle(self, delivery, context):\n        pass\n\n\n"
            "def factory():\n    return Sink()\n",
            "handler: failed: wrong signature: the worker calls handle(delivery) with one "
            "argument, but it is handle(delivery, context)",
        ),
        (
            "class Sink:\n    def handle(self, delivery):\n        pass\n\n\n"
            "def factory():\n    return Sink()\n",
            "handler: failed: wrong signature: handle must be `async def handle(self, "
            "delivery)`; it is not a coroutine function",
        ),
        (
            "class Sink:\n    async def consume(self, delivery):\n        pass\n\n\n"
            "def factory():\n    return Sink()\n",
            "handler: failed: <bad_sink.Sink object at",
        ),
        (
            "import bad_sink_helpers\n",
            "import: failed: missing dependency: bad_sink imports 'bad_sink_helpers'",
        ),
    ],
)
def test_a_wrong_signature_is_said_in_words(
    venvs: Path, tmp_path: Path, source: str, expected: str
) -> None:
    directory = tmp_path / "handler"
    directory.mkdir()
    (directory / "bad_sink.py").write_text(source)
    code, said = check(directory, "bad_sink:factory", venvs / "pins-only")
    assert code == 1
    assert expected in said, said


def test_what_the_synth_would_refuse_fails_before_any_virtualenv(tmp_path: Path) -> None:
    directory = copy_of_example(tmp_path, requirements=True)
    (directory / "requirements.txt").write_text("boto3==1.30.0\n")
    code, said = check(directory, FACTORY, tmp_path / "never-built")
    assert code == 1
    assert "failed: the handler's requirement 'boto3==1.30.0'" in said
    assert "conflicts with the worker's pin 'boto3==" in said
    assert not (tmp_path / "never-built").exists()
    code, said = check(directory, "trade_store.sink", tmp_path / "never-built")
    assert "failed: factory must look like 'package.module:factory'" in said
