"""Plug-in protocols registered by name: a spec naming one (shape and size checked,
options the plug-in's own), the worker loading the registry at start (a bad entry
stops it with exit status 2, naming the entry), and one configured instance per
connection (docs/PROTOCOLS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

from examples.tickline.protocol import TicklineProtocol
from tests.support.timing import scaled
from worker.plugins import PluginError
from worker.protocol_plugins import (
    NO_PLUGINS,
    PluginSetupError,
    ProtocolPlugins,
    connection_protocol,
    default_protocol,
    load_plugins,
)
from worker.upstream_protocol import JsonSeqProtocol, LiveProtocol, Message
from wsfleet.protocol_registry import registry_text
from wsfleet.protocol_specs import (
    MAX_SPEC_BYTES,
    InvalidProtocolError,
    UnknownProtocolError,
    parse_spec,
    spec_from_item,
)

TICKLINE = "examples.tickline.protocol:factory"
HERE = "tests.unit.test_protocol_plugins"


class Bare:
    """A plug-in of before the registry: resume_url and decode only."""

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        return ws_url

    def decode(self, data: str | bytes) -> Message:
        return Message(1, data)


class Configured(Bare):
    made = 0

    def __init__(self) -> None:
        Configured.made += 1
        self.options: dict[str, Any] | None = None

    def configure(self, options: Mapping[str, Any]) -> None:
        if options.get("refuse"):
            raise ValueError(f"cannot take refuse={options['refuse']}")
        self.options = dict(options)


def make_bare() -> Bare:
    return Bare()


def make_configured() -> Configured:
    return Configured()


def make_nothing() -> object:
    return object()


def make_failing() -> Bare:
    raise RuntimeError("no licence file")


# --- the spec ------------------------------------------------------------------------------


def test_a_registered_plugin_is_a_valid_name_with_options_of_its_own():
    raw = {"name": "acme-feed", "options": {"channel": "q", "nested": {"any": [1, "x", None]}}}
    spec = parse_spec(raw, plugins={"acme-feed"})
    assert (spec.name, dict(spec.options)) == ("acme-feed", raw["options"])
    # No built-in option rule applies: "sequence" or "resume" mean what the plug-in says.
    odd = {"name": "acme-feed", "options": {"resume": "magic", "subscribe": "${nope}"}}
    assert parse_spec(odd, plugins={"acme-feed"}).options == odd["options"]
    assert spec_from_item(spec.to_item(), plugins={"acme-feed"}) == spec


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"name": "acme-feed", "options": []}, "options must be an object"),
        ({"name": "acme-feed", "options": {"x": "y" * MAX_SPEC_BYTES}}, "more than 4096"),
        ({"name": "acme-feed", "options": {"x": float("nan")}}, "finite"),
        ({"name": "acme-feed", "extra": 1}, "unknown keys"),
    ],
)
def test_a_plugins_spec_is_checked_for_shape_and_size(raw, says):
    with pytest.raises(InvalidProtocolError, match=says):
        parse_spec(raw, plugins={"acme-feed"})


def test_an_unregistered_name_is_refused_with_the_names_there_are():
    with pytest.raises(UnknownProtocolError) as refused:
        parse_spec({"name": "acme-fed"}, plugins={"tickline", "acme-feed"})
    assert str(refused.value) == (
        "protocol name must be one of ['json-seq', 'json-field', 'live', 'acme-feed', "
        "'tickline'], got 'acme-fed' (plug-in protocols are those the deployment registers "
        "in UPSTREAM_PROTOCOLS)"
    )
    assert refused.value.known == ["json-seq", "json-field", "live", "acme-feed", "tickline"]
    with pytest.raises(UnknownProtocolError):
        parse_spec({"name": "acme-feed"})  # without the registry
    with pytest.raises(UnknownProtocolError):
        parse_spec({"name": ["acme-feed"]}, plugins={"acme-feed"})


def test_the_built_ins_still_validate_with_a_registry():
    with pytest.raises(InvalidProtocolError, match=r'"sequence" \(a JSON pointer\) is required'):
        parse_spec({"name": "json-field"}, plugins={"acme-feed"})
    spec = parse_spec({"name": "live", "options": {"inflate": "gzip"}}, plugins={"acme-feed"})
    assert spec.name == "live"


def test_the_registry_is_written_compact_and_sorted():
    assert registry_text({"b": "b.m:f", "a": "a.m:f"}) == '{"a":"a.m:f","b":"b.m:f"}'


# --- the worker: loaded at start ---------------------------------------------------------


def test_every_registered_factory_is_loaded_and_checked_once_at_start():
    Configured.made = 0
    plugins = load_plugins({"c": f"{HERE}:make_configured", "bare": f"{HERE}:make_bare"})
    assert plugins.names == {"c", "bare"}
    assert Configured.made == 1  # called once, to check it makes a protocol
    assert plugins.default is None
    assert load_plugins({"c": f"{HERE}:make_configured"}, "c").default == "c"


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("no_such_module_xyz:factory", "UPSTREAM_PROTOCOLS 'p': cannot import 'no_such_module"),
        (f"{HERE}:no_such_factory", f"UPSTREAM_PROTOCOLS 'p': {HERE}.no_such_factory is not"),
        (f"{HERE}:make_nothing", "not a protocol"),
        (f"{HERE}:make_failing", "make_failing() failed: RuntimeError: no licence file"),
    ],
)
def test_a_factory_that_cannot_work_stops_the_worker_at_start(factory, says):
    with pytest.raises(PluginError) as refused:
        load_plugins({"p": factory})
    assert says in str(refused.value)


def test_a_plugin_module_that_fails_while_it_is_imported_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin_xyz.py").write_text('raise RuntimeError("needs ACME_HOME")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as refused:
        load_plugins({"broken": "broken_plugin_xyz:factory"})
    assert str(refused.value) == (
        "UPSTREAM_PROTOCOLS 'broken': importing 'broken_plugin_xyz' failed: "
        "RuntimeError: needs ACME_HOME"
    )


def test_the_default_may_name_a_registered_protocol_which_must_take_empty_options():
    plugins = load_plugins({"c": f"{HERE}:make_configured"}, "c")
    made = default_protocol("c", plugins)
    assert isinstance(made, Configured)
    assert made.options == {}
    assert isinstance(default_protocol("json-seq", plugins), JsonSeqProtocol)
    tickline = load_plugins({"tickline": TICKLINE}, "tickline")
    with pytest.raises(PluginError, match="UPSTREAM_PROTOCOL: protocol 'tickline' refused"):
        default_protocol("tickline", tickline)  # it needs a channel


def test_python_m_worker_exits_2_naming_the_entry(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "TABLE_NAME": "t",
        "QUEUE_URL": "http://127.0.0.1:9/q",
        "HEALTH_FILE": str(tmp_path / "alive"),
        "UPSTREAM_PROTOCOLS": json.dumps({"good": TICKLINE, "broken": "no_such_plugin:factory"}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "UPSTREAM_PROTOCOLS 'broken': cannot import 'no_such_plugin'" in done.stderr
    bad_name = {**env, "UPSTREAM_PROTOCOLS": json.dumps({"live": TICKLINE})}
    done = subprocess.run(
        [sys.executable, "-m", "worker"],
        env=bad_name,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert done.returncode == 2
    assert "UPSTREAM_PROTOCOLS: 'live' is a built-in protocol" in done.stderr


# --- the worker: one configured instance per connection ------------------------------------


def stored(name: str, **options: Any) -> str:
    return json.dumps({"name": name, "options": options})


def test_each_connection_gets_a_fresh_instance_configured_with_its_options():
    plugins = load_plugins({"c": f"{HERE}:make_configured", "tickline": TICKLINE})
    default = JsonSeqProtocol()
    one = connection_protocol(stored("c", channel="a"), default, plugins)
    two = connection_protocol(stored("c", channel="b"), default, plugins)
    assert isinstance(one, Configured)
    assert isinstance(two, Configured)
    assert one is not two
    assert (one.options, two.options) == ({"channel": "a"}, {"channel": "b"})
    tick = connection_protocol(stored("tickline", channel="quotes"), default, plugins)
    assert isinstance(tick, TicklineProtocol)
    assert tick.channel == "quotes"
    # The built-ins and the default as before.
    assert isinstance(connection_protocol(stored("live"), default, plugins), LiveProtocol)
    assert connection_protocol(None, default, plugins) is default
    assert connection_protocol(None, default) is default


def test_a_plugin_without_configure_is_used_as_its_factory_made_it():
    plugins = load_plugins({"bare": f"{HERE}:make_bare"})
    assert isinstance(connection_protocol(stored("bare", x=1), Bare(), plugins), Bare)


def test_without_a_spec_a_registered_default_is_a_fresh_instance_with_empty_options():
    plugins = load_plugins({"c": f"{HERE}:make_configured"}, "c")
    one = connection_protocol(None, JsonSeqProtocol(), plugins)
    two = connection_protocol(None, JsonSeqProtocol(), plugins)
    assert isinstance(one, Configured)
    assert one is not two
    assert one.options == {}


def test_a_plugin_that_refuses_its_options_or_fails_costs_that_connection_only():
    plugins = ProtocolPlugins({"c": make_configured, "f": make_failing, "n": make_nothing})
    with pytest.raises(PluginSetupError) as refused:
        connection_protocol(stored("c", refuse="yes"), JsonSeqProtocol(), plugins)
    assert str(refused.value) == (
        "protocol 'c' refused its options: ValueError: cannot take refuse=yes"
    )
    with pytest.raises(PluginSetupError, match="protocol 'f': its factory failed: RuntimeError"):
        connection_protocol(stored("f"), JsonSeqProtocol(), plugins)
    with pytest.raises(PluginSetupError, match="made a object, not a protocol"):
        connection_protocol(stored("n"), JsonSeqProtocol(), plugins)
    # The next connection of the same plug-in is not affected.
    assert isinstance(connection_protocol(stored("c"), JsonSeqProtocol(), plugins), Configured)


def test_a_stored_name_this_worker_does_not_have_is_refused_by_name():
    with pytest.raises(UnknownProtocolError) as refused:
        connection_protocol(stored("acme-feed"), JsonSeqProtocol(), NO_PLUGINS)
    assert refused.value.name == "acme-feed"
    assert refused.value.known == ["json-seq", "json-field", "live"]
