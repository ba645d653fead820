import json
import re
from pathlib import Path

import pytest

from worker.config import ConfigError, WorkerConfig, timing_from_env
from wsfleet.timing import LeaseTiming

BASE = {"TABLE_NAME": "connections", "QUEUE_URL": "http://q/1/starts"}


def test_defaults():
    config = WorkerConfig.from_env(BASE)
    assert config.timing == LeaseTiming.from_lease(2.2)
    assert config.timing.lease == 2.2
    assert config.upstream_fail_after == 600
    assert config.upstream_connect_burst == 200
    assert config.upstream_connects_per_second == 100
    assert config.timing.heartbeat == pytest.approx(0.594)
    assert config.timing.reconcile == pytest.approx(0.594)
    assert config.timing.margin == pytest.approx(0.22)
    assert config.timing.checkpoint == 5
    assert config.max_connections == 500
    assert config.reassign_on_release is True
    assert config.upstream_protocol == "json-seq"
    assert config.handler_errors == "retry"
    assert config.metrics_namespace == "WebSocketFleet"
    assert config.service_name == "websocket-fleet"
    assert config.handler is None
    assert config.ping_interval == 1.0  # a heartbeat, and never under a second
    assert config.ping_timeout == 5.0  # longer than the interval: a busy loop answers late
    assert config.secret_cache_seconds == 300
    assert config.max_batch_messages == 500
    assert config.max_batch_bytes == 4 * 1024 * 1024


def test_worker_ids_are_unique_per_process_by_default():
    assert WorkerConfig.from_env(BASE).worker_id != WorkerConfig.from_env(BASE).worker_id


def test_overrides():
    env = BASE | {
        "WORKER_ID": "w-1",
        "LEASE_SECONDS": "2",
        "HEARTBEAT_SECONDS": "0.4",
        "RECONCILE_SECONDS": "0.5",
        "MAX_SKEW_SECONDS": "0.1",
        "MAX_CONNECTIONS": "3",
        "REASSIGN_ON_RELEASE": "false",
        "HANDLER_ERRORS": "skip",
        "HANDLER": "pkg.mod:make",
        "METRICS_NAMESPACE": "Ns",
        "SERVICE_NAME": "svc",
        "HEALTH_FILE": "/tmp/h",
        "UPSTREAM_FAIL_AFTER_SECONDS": "2.5",
        "CHECKPOINT_SECONDS": "7.5",
        "SECRET_CACHE_SECONDS": "0",
        "PING_INTERVAL_SECONDS": "2",
        "PING_TIMEOUT_SECONDS": "7.5",
        "MAX_BATCH_MESSAGES": "1",
        "MAX_BATCH_BYTES": " 65536 ",
    }
    config = WorkerConfig.from_env(env)
    assert config.secret_cache_seconds == 0  # read at every connection attempt
    assert config.upstream_fail_after == 2.5
    assert config.worker_id == "w-1"
    assert (config.timing.lease, config.timing.heartbeat) == (2, 0.4)
    assert config.timing.reconcile == 0.5
    assert config.timing.checkpoint == 7.5
    assert config.max_connections == 3
    assert config.reassign_on_release is False
    assert config.handler_errors == "skip"
    assert config.handler == "pkg.mod:make"
    assert (config.metrics_namespace, config.service_name) == ("Ns", "svc")
    assert config.health_file == Path("/tmp/h")
    assert (config.ping_interval, config.ping_timeout) == (2, 7.5)
    assert (config.max_batch_messages, config.max_batch_bytes) == (1, 65536)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"QUEUE_URL": "q"}, "TABLE_NAME is required"),
        ({"TABLE_NAME": "t"}, "QUEUE_URL is required"),
        (BASE | {"LEASE_SECONDS": "abc"}, "LEASE_SECONDS must be a number"),
        (BASE | {"LEASE_SECONDS": "-2"}, "LEASE_SECONDS must be > 0"),
        (BASE | {"LEASE_SECONDS": "1"}, "lease must be >= 1.5 s, got 1.0"),
        (BASE | {"HEARTBEAT_SECONDS": "9"}, "3 renew attempts"),
        (BASE | {"CHECKPOINT_SECONDS": "often"}, "CHECKPOINT_SECONDS must be a number"),
        (BASE | {"CHECKPOINT_SECONDS": "0"}, "checkpoint must be > 0 s"),
        (BASE | {"CHECKPOINT_SECONDS": "-5"}, "checkpoint must be > 0 s"),
        (BASE | {"CHECKPOINT_SECONDS": "301"}, "checkpoint must be <= 300.0 s"),
        (BASE | {"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS must be >= 1"),
        (BASE | {"MAX_CONNECTIONS": "many"}, "MAX_CONNECTIONS must be an integer"),
        (BASE | {"REASSIGN_ON_RELEASE": "maybe"}, "REASSIGN_ON_RELEASE must be true or false"),
        (BASE | {"HANDLER_ERRORS": "ignore"}, "HANDLER_ERRORS must be"),
        (BASE | {"SQS_WAIT_SECONDS": "21"}, "SQS_WAIT_SECONDS"),
        (BASE | {"PING_TIMEOUT_SECONDS": "0"}, "PING_TIMEOUT_SECONDS must be > 0"),
        (BASE | {"PING_TIMEOUT_SECONDS": "never"}, "PING_TIMEOUT_SECONDS must be a number"),
        (BASE | {"UPSTREAM_FAIL_AFTER_SECONDS": "0"}, "UPSTREAM_FAIL_AFTER_SECONDS must be > 0"),
        (BASE | {"UPSTREAM_FAIL_AFTER_SECONDS": "-1"}, "UPSTREAM_FAIL_AFTER_SECONDS must be > 0"),
        (BASE | {"UPSTREAM_FAIL_AFTER_SECONDS": "soon"}, "UPSTREAM_FAIL_AFTER_SECONDS must be"),
        (BASE | {"SECRET_CACHE_SECONDS": "-1"}, "SECRET_CACHE_SECONDS must be from 0 to 86400"),
        (BASE | {"SECRET_CACHE_SECONDS": "86401"}, "SECRET_CACHE_SECONDS must be from 0"),
        (BASE | {"SECRET_CACHE_SECONDS": "a while"}, "SECRET_CACHE_SECONDS must be a number"),
        (BASE | {"MAX_BATCH_MESSAGES": "0"}, "MAX_BATCH_MESSAGES must be >= 1, got 0"),
        (BASE | {"MAX_BATCH_MESSAGES": "-5"}, "MAX_BATCH_MESSAGES must be >= 1"),
        (BASE | {"MAX_BATCH_MESSAGES": "lots"}, "MAX_BATCH_MESSAGES must be an integer"),
        (BASE | {"MAX_BATCH_BYTES": "0"}, "MAX_BATCH_BYTES must be >= 1, got 0"),
        (BASE | {"MAX_BATCH_BYTES": "4MiB"}, "MAX_BATCH_BYTES must be an integer"),
        (BASE | {"UPSTREAM_CONNECT_BURST": "-1"}, "UPSTREAM_CONNECT_BURST must be >= 0"),
        (BASE | {"UPSTREAM_CONNECT_BURST": "2.5"}, "UPSTREAM_CONNECT_BURST must be an integer"),
        (BASE | {"UPSTREAM_CONNECT_BURST": "lots"}, "UPSTREAM_CONNECT_BURST must be an integer"),
        (
            BASE | {"UPSTREAM_CONNECTS_PER_SECOND": "-0.5"},
            "UPSTREAM_CONNECTS_PER_SECOND must be a finite number >= 0",
        ),
        (
            BASE | {"UPSTREAM_CONNECTS_PER_SECOND": "inf"},
            "UPSTREAM_CONNECTS_PER_SECOND must be a finite number >= 0",
        ),
        (
            BASE | {"UPSTREAM_CONNECTS_PER_SECOND": "nan"},
            "UPSTREAM_CONNECTS_PER_SECOND must be a finite number >= 0",
        ),
        (
            BASE | {"UPSTREAM_CONNECTS_PER_SECOND": "fast"},
            "UPSTREAM_CONNECTS_PER_SECOND must be a number per second, got 'fast'",
        ),
    ],
)
def test_bad_settings_fail_fast_naming_the_variable(env, fragment):
    with pytest.raises(ConfigError, match=fragment):
        WorkerConfig.from_env(env)


@pytest.mark.parametrize(
    ("env", "burst", "rate"),
    [
        ({}, 200, 100.0),
        ({"UPSTREAM_CONNECT_BURST": " ", "UPSTREAM_CONNECTS_PER_SECOND": ""}, 200, 100.0),
        ({"UPSTREAM_CONNECT_BURST": "10", "UPSTREAM_CONNECTS_PER_SECOND": "20"}, 10, 20.0),
        ({"UPSTREAM_CONNECTS_PER_SECOND": "2.5"}, 200, 2.5),
        # 0 in either: no pacing
        ({"UPSTREAM_CONNECT_BURST": "0"}, 0, 100.0),
        ({"UPSTREAM_CONNECTS_PER_SECOND": "0"}, 200, 0.0),
    ],
)
def test_connect_pacing(env, burst, rate):
    config = WorkerConfig.from_env(BASE | env)
    assert (config.upstream_connect_burst, config.upstream_connects_per_second) == (burst, rate)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("", 5.0), ("   ", 5.0), ("1", 1.0), (" 7.5 ", 7.5), ("300", 300.0), ("0.25", 0.25)],
)
def test_checkpoint_seconds(raw, seconds):
    assert timing_from_env({"CHECKPOINT_SECONDS": raw}).checkpoint == seconds


def test_a_timing_error_names_the_timing_rule():
    with pytest.raises(ConfigError) as raised:
        timing_from_env({"CHECKPOINT_SECONDS": "301"})
    assert str(raised.value) == "invalid lease timing: checkpoint must be <= 300.0 s, got 301.0"


def test_settings_names_every_variable_the_config_reads():
    """A setting added to worker/config.py without SETTINGS would be refused by the
    deployment's ``workerSettings`` (and by ``check_names``)."""
    import re

    from worker import config

    names = {name for name, value in vars(config).items() if value == name}
    assert names == config.SETTINGS
    assert len(config.SETTINGS) == 33
    source = Path(config.__file__).read_text()
    read = re.findall(r"\(env, ([A-Z_]+)|env\.get\(([A-Z_]+)", source)
    assert read
    assert {a or b for a, b in read} <= config.SETTINGS


def test_check_names_refuses_what_the_worker_does_not_read():
    from worker.config import SETTINGS, check_names

    check_names(["HANDLER_ERRORS", "BALANCE_ROUND_SECONDS"])
    with pytest.raises(
        ConfigError, match=r"not a worker setting: HANDLER_ERORS \(the worker reads"
    ):
        check_names(["HANDLER_ERORS", "LOG_LEVEL"])
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL_DYNAMODB"):
        check_names(["AWS_ENDPOINT_URL_DYNAMODB"])
    assert "HANDLER_ERRORS" in SETTINGS


def test_config_imports_only_the_standard_library_and_wsfleet():
    """websocket_fleet loads worker/config.py by its path (an installed copy has no
    ``worker`` package to import): it must not import the rest of the worker."""
    import ast
    import sys

    from worker import config

    tree = ast.parse(Path(config.__file__).read_text())
    modules = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    outside = {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names | {"wsfleet"}}
    assert outside == set()


def test_a_setting_no_longer_read_is_ignored_with_a_reason():
    """MAX_SKEW_SECONDS decided the reap by wall clock; expiry is now observed on each
    worker's own monotonic clock. An environment that still sets it starts as before,
    and the worker says why it is ignored."""
    from worker.config import ignored_settings

    env = {"TABLE_NAME": "t", "QUEUE_URL": "q", "MAX_SKEW_SECONDS": "0.2"}
    assert WorkerConfig.from_env(env).timing.fence_after == pytest.approx(1.98)
    (line,) = ignored_settings(env)
    assert line.startswith("MAX_SKEW_SECONDS is set but no longer a setting (ignored)")
    assert ignored_settings({"TABLE_NAME": "t"}) == []


def test_the_batch_caps_reach_every_connection():
    """The caps are read once here and shared by the worker's connection runners."""
    from types import SimpleNamespace
    from typing import Any, cast

    from worker.fleet_worker import Worker, WorkerDeps

    config = WorkerConfig.from_env(BASE | {"MAX_BATCH_MESSAGES": "7", "MAX_BATCH_BYTES": "9000"})
    store = cast(Any, SimpleNamespace(timing=config.timing))
    deps = WorkerDeps(
        store=store,
        sessions=store,
        renewals=store,
        sqs=cast(Any, None),
        handler=cast(Any, None),
        protocol=cast(Any, None),
    )
    settings = Worker(config, deps).ownership._settings
    assert (settings.max_batch_messages, settings.max_batch_bytes) == (7, 9000)


def test_the_event_loop_and_json_decoder_default_to_the_accelerators_installed():
    from wsfleet import accelerators

    config = WorkerConfig.from_env(BASE)
    assert config.event_loop == accelerators.default_event_loop()
    assert config.json_decoder == accelerators.default_json_decoder()
    plain = WorkerConfig.from_env({**BASE, "EVENT_LOOP": " asyncio ", "JSON_DECODER": "JSON"})
    assert (plain.event_loop, plain.json_decoder) == ("asyncio", "json")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EVENT_LOOP", "trio", "EVENT_LOOP must be one of asyncio, uvloop, got 'trio'"),
        ("JSON_DECODER", "ujson", "JSON_DECODER must be one of json, orjson, got 'ujson'"),
    ],
)
def test_an_unknown_event_loop_or_decoder_is_refused(name, value, message):
    with pytest.raises(ConfigError) as raised:
        WorkerConfig.from_env({**BASE, name: value})
    assert str(raised.value) == message


def test_a_missing_accelerator_is_refused_at_start_not_at_synth(monkeypatch):
    """The construct validates the settings on the machine that synthesizes, which
    need not have uvloop; the worker checks that it has it when it starts."""
    from worker import config as settings
    from wsfleet import accelerators

    monkeypatch.setattr(accelerators, "installed", lambda name: name in accelerators.BUILT_IN)
    config = WorkerConfig.from_env({**BASE, "EVENT_LOOP": "uvloop"})
    with pytest.raises(ConfigError, match="EVENT_LOOP=uvloop, but uvloop is not installed"):
        settings.check_installed(config)
    settings.check_installed(
        WorkerConfig.from_env({**BASE, "EVENT_LOOP": "asyncio", "JSON_DECODER": "json"})
    )


# --- plug-in protocols by name (UPSTREAM_PROTOCOLS) ---------------------------------------


def test_plugin_protocols_are_registered_by_name_and_one_may_be_the_default():
    registry = {"acme-feed": "acme.feed:factory", "tickline": "examples.tickline.protocol:factory"}
    env = BASE | {"UPSTREAM_PROTOCOLS": json.dumps(registry), "UPSTREAM_PROTOCOL": "acme-feed"}
    config = WorkerConfig.from_env(env)
    assert config.upstream_protocols == registry
    assert config.upstream_protocol == "acme-feed"
    plain = WorkerConfig.from_env(BASE | {"UPSTREAM_PROTOCOLS": " "})
    assert (plain.upstream_protocols, plain.upstream_protocol) == ({}, "json-seq")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("acme.feed:factory", "UPSTREAM_PROTOCOLS: is not JSON"),
        ('["acme.feed:factory"]', "UPSTREAM_PROTOCOLS: must map names to factories"),
        ('{"Acme": "acme.feed:factory"}', "'Acme' is not a protocol name"),
        ('{"-acme": "acme.feed:factory"}', "'-acme' is not a protocol name"),
        ('{"' + "a" * 64 + '": "acme.feed:factory"}', "is not a protocol name"),
        ('{"live": "acme.feed:factory"}', "'live' is a built-in protocol"),
        ('{"json-seq": "acme.feed:factory"}', "'json-seq' is a built-in protocol"),
        ('{"acme": "acme.feed"}', "acme: the factory must look like 'package.module:factory'"),
        ('{"acme": "acme feed:make"}', "must look like 'package.module:factory'"),
        ('{"acme": 3}', "must look like 'package.module:factory', got 3"),
        (json.dumps({f"p{n}": "a.b:c" for n in range(33)}), "33 protocols, more than 32"),
        (json.dumps({f"p{n}": "a." + "b" * 90 + ":c" for n in range(20)}), "more than 2048"),
    ],
)
def test_a_registry_that_cannot_work_is_refused_naming_the_entry(value, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        WorkerConfig.from_env(BASE | {"UPSTREAM_PROTOCOLS": value})


@pytest.mark.parametrize(
    ("default", "registry", "ok"),
    [
        ("json-seq", {}, True),
        ("pkg.mod:make", {}, True),
        ("acme-feed", {"acme-feed": "acme.feed:factory"}, True),
        ("acme-feed", {}, False),
        ("live", {}, False),
        ("no-colon", {"acme-feed": "acme.feed:factory"}, False),
    ],
)
def test_the_default_protocol_is_json_seq_a_registered_name_or_a_factory(default, registry, ok):
    env = BASE | {"UPSTREAM_PROTOCOL": default, "UPSTREAM_PROTOCOLS": json.dumps(registry)}
    if ok:
        assert WorkerConfig.from_env(env).upstream_protocol == default
        return
    with pytest.raises(ConfigError) as refused:
        WorkerConfig.from_env(env)
    names = ", ".join(["json-seq", *registry])
    assert str(refused.value) == (
        f"UPSTREAM_PROTOCOL must be one of {names} (those registered in UPSTREAM_PROTOCOLS) "
        f"or a 'package.module:factory', got {default!r}"
    )
