import itertools

import pytest
from botocore.exceptions import ClientError

from wsfleet.desired_state import (
    DesiredStateStore,
    StartContendedError,
    StartOutcome,
    StartVariant,
    start_failure,
    start_update,
)
from wsfleet.item import ConnectionItem, to_attribute


def failed(item: dict | None) -> ClientError:
    response = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "no"}}
    if item is not None:
        response["Item"] = {k: to_attribute(v) for k, v in item.items()}
    return ClientError(response, "UpdateItem")


class FlippingClient:
    """Every write fails: the item flips between STOPPED-with-another-URL and gone,
    as if other callers kept stopping, deleting and restarting it."""

    def __init__(self) -> None:
        self.calls = 0
        self._olds = itertools.cycle(
            [{"Pk": "CONN#c", "desired_state": "STOPPED", "ws_url": "wss://other"}, None]
        )

    def update_item(self, **kwargs):
        self.calls += 1
        raise failed(next(self._olds))


def test_a_start_that_keeps_losing_races_gives_up_with_a_domain_error():
    client = FlippingClient()
    store = DesiredStateStore(client, "t")  # type: ignore[arg-type]
    with pytest.raises(StartContendedError):
        store.start("c", "wss://mine", 1)
    assert client.calls == 4


def item(**fields) -> ConnectionItem:
    return ConnectionItem(connection_id="c", desired_state="STARTED", ws_url="wss://a", **fields)


def stopped(**fields) -> ConnectionItem:
    return ConnectionItem(connection_id="c", desired_state="STOPPED", ws_url="wss://a", **fields)


PARKED = {"parked_reason": "HTTP 404 from upstream", "parked_at_ms": 3}


@pytest.mark.parametrize(
    ("old", "url", "expected"),
    [
        (None, "wss://a", StartVariant()),
        (item(), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(), "wss://b", StartOutcome.CONFLICT),
        (stopped(), "wss://a", StartVariant()),
        (stopped(), "wss://b", StartVariant(url_changed=True)),
        # A parked connection is re-armed, STARTED or STOPPED, for any URL.
        (item(**PARKED), "wss://a", StartVariant(rearm=True)),
        (item(**PARKED), "wss://b", StartVariant(url_changed=True, rearm=True)),
        (stopped(**PARKED), "wss://a", StartVariant(rearm=True)),
        (stopped(**PARKED), "wss://b", StartVariant(url_changed=True, rearm=True)),
    ],
)
def test_start_failure_decisions(old, url, expected):
    assert start_failure(old, url) == expected


@pytest.mark.parametrize("url_changed", [False, True])
def test_rearming_takes_only_parked_items_and_clears_every_mark(url_changed):
    update = start_update("wss://a", 5, url_changed=url_changed, rearm=True)
    condition = update["ConditionExpression"]
    assert condition.startswith("attribute_exists(#parked) AND ")
    assert ("#url <> :url" in condition) is url_changed
    expression = update["UpdateExpression"]
    assert "#expiry = :zero" in expression  # back in the orphan query
    assert "REMOVE #ttl, #parked, #parkedat, #failing" in expression
    assert "ADD #gen :one" + (", #seqgen :one" if url_changed else "") in expression
    assert ("#seq = :zero" in expression) is url_changed
    names = update["ExpressionAttributeNames"]
    assert {names[n] for n in ("#parked", "#parkedat", "#failing")} == {
        "parked_reason",
        "parked_at_ms",
        "failing_since_ms",
    }


@pytest.mark.parametrize("url_changed", [False, True])
def test_the_ordinary_starts_refuse_a_parked_item(url_changed):
    update = start_update("wss://a", 5, url_changed=url_changed)
    assert "attribute_not_exists(#parked)" in update["ConditionExpression"]
    assert "#expiry = if_not_exists(#expiry, :zero)" in update["UpdateExpression"]


def test_changed_url_resets_the_checkpoint_and_same_url_keeps_it():
    changed = start_update("wss://b", 5, url_changed=True)
    assert "#seq = :zero" in changed["UpdateExpression"]
    assert "#url <> :url" in changed["ConditionExpression"]
    assert "#pk" not in changed["ExpressionAttributeNames"]
    same = start_update("wss://a", 5, url_changed=False)
    assert "#seq = if_not_exists(#seq, :zero)" in same["UpdateExpression"]
    assert "attribute_not_exists(#pk)" in same["ConditionExpression"]
    for update in (changed, same):
        assert "ADD #gen :one" in update["UpdateExpression"]
        assert "REMOVE #ttl" in update["UpdateExpression"]
