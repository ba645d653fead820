"""Starts that name a plug-in protocol the deployment registered (``UPSTREAM_PROTOCOLS``,
the workers' very setting): stored as given, options checked for shape and size only;
a name the deployment does not have refused with the names it has; the built-ins
validated as before, registry or not; through the HTTP API and EventBridge alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lambdas.router import main
from lambdas.router.settings import RouterSettings, SettingsError
from tests.router.fixtures import assert_error, load_event, response_json
from tests.router.unit.conftest import Router
from tests.router.unit.test_upstreams import REFUSED_SPECS, post, protocol_message
from wsfleet.protocol_specs import MAX_SPEC_BYTES
from wsfleet.start_messages import StartMessage

REGISTRY = {"acme-feed": "acme.feed:factory", "tickline": "tickline_plugin.protocol:factory"}
TICKLINE = {"name": "tickline", "options": {"channel": "quotes", "levels": [1, 2], "x": None}}


@pytest.fixture
def registered(router: Router, monkeypatch: pytest.MonkeyPatch) -> Router:
    """The router of a deployment that registered two plug-ins."""
    monkeypatch.setenv("UPSTREAM_PROTOCOLS", json.dumps(REGISTRY))
    main.service.cache_clear()
    return router


def test_a_start_naming_a_registered_plugin_is_stored_as_given(registered: Router) -> None:
    response = post(registered, protocol=TICKLINE)

    assert response["statusCode"] == 201, response
    assert response_json(response)["protocol"] == TICKLINE
    raw = registered.raw_item("quotes-1")
    assert raw["protocol"] == {
        "S": '{"name":"tickline","options":{"channel":"quotes","levels":[1,2],"x":null}}'
    }
    assert registered.start_messages() == [StartMessage("start", "quotes-1")]
    # The same spec again is the same protocol: 200, nothing changes.
    before = registered.state()
    again = post(registered, protocol=json.loads(json.dumps(TICKLINE)))
    assert again["statusCode"] == 200
    assert registered.state() == before


def test_an_unregistered_name_is_a_400_listing_the_names_the_deployment_has(
    registered: Router,
) -> None:
    before = registered.state()
    body = assert_error(
        post(registered, protocol={"name": "ticklines", "options": {}}), 400, "invalid_protocol"
    )
    assert body["message"] == (
        "protocol name must be one of ['json-seq', 'json-field', 'live', 'acme-feed', "
        "'tickline'], got 'ticklines' (plug-in protocols are those the deployment registers "
        "in UPSTREAM_PROTOCOLS)"
    )
    assert registered.state() == before
    assert registered.item("quotes-1") is None


def test_without_the_registry_a_plugin_name_is_refused(router: Router) -> None:
    body = assert_error(post(router, protocol=TICKLINE), 400, "invalid_protocol")
    assert "['json-seq', 'json-field', 'live'], got 'tickline'" in body["message"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"name": "tickline", "options": {"blob": "x" * MAX_SPEC_BYTES}}, "more than 4096"),
        ({"name": "tickline", "options": {"n": float("nan")}}, "finite"),
        ({"name": "tickline", "options": []}, None),
        ({"name": "tickline", "options": "channel=quotes"}, None),
        ({"name": "tickline", "version": 1}, None),
    ],
)
def test_a_plugins_spec_of_the_wrong_shape_or_size_is_refused(
    registered: Router, spec: dict[str, Any], says: str | None
) -> None:
    before = registered.state()
    body = assert_error(post(registered, protocol=spec), 400, "invalid_protocol")
    if says is not None:
        assert says in body["message"]
    assert registered.state() == before


@pytest.mark.parametrize("spec", REFUSED_SPECS)
def test_the_built_ins_validate_as_before_with_a_registry(
    registered: Router, spec: dict[str, Any]
) -> None:
    body = assert_error(post(registered, protocol=spec), 400, "invalid_protocol")
    if spec.get("name") in ("json-seq", "json-field", "live"):
        assert body["message"] == protocol_message(spec)
    else:
        assert "'acme-feed', 'tickline']" in body["message"]


def test_a_start_event_may_name_a_registered_plugin(registered: Router) -> None:
    event = load_event("eventbridge_start")
    event["detail"] = {**event["detail"], "protocol": TICKLINE}
    assert registered.invoke(event)["ok"] is True
    item = registered.item(event["detail"]["connection_id"])
    assert item is not None
    assert json.loads(item.protocol or "") == TICKLINE
    refused = {**event, "detail": {**event["detail"], "connection_id": "other"}}
    refused["detail"]["protocol"] = {"name": "nope"}
    answer = registered.invoke(refused)
    assert answer["ok"] is False
    assert "got 'nope'" in answer["error"]


def test_a_registry_the_router_cannot_read_stops_it() -> None:
    base = {"TABLE_NAME": "t", "QUEUE_URL": "q"}
    assert RouterSettings.from_env(base).plugin_protocols == frozenset()
    settings = RouterSettings.from_env(base | {"UPSTREAM_PROTOCOLS": json.dumps(REGISTRY)})
    assert settings.plugin_protocols == {"acme-feed", "tickline"}
    with pytest.raises(SettingsError, match="UPSTREAM_PROTOCOLS: 'live' is a built-in"):
        RouterSettings.from_env(base | {"UPSTREAM_PROTOCOLS": '{"live": "a.b:c"}'})
    with pytest.raises(SettingsError, match="UPSTREAM_PROTOCOLS: is not JSON"):
        RouterSettings.from_env(base | {"UPSTREAM_PROTOCOLS": "acme-feed"})
