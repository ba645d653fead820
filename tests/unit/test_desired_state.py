import itertools

import pytest
from botocore.exceptions import ClientError

from wsfleet.desired_state import (
    DesiredStateStore,
    StartContendedError,
    StartOutcome,
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


@pytest.mark.parametrize(
    ("old", "url", "expected"),
    [
        (None, "wss://a", None),
        (item(), "wss://a", StartOutcome.ALREADY_STARTED),
        (item(), "wss://b", StartOutcome.CONFLICT),
        (
            ConnectionItem(connection_id="c", desired_state="STOPPED", ws_url="wss://a"),
            "wss://b",
            None,
        ),
    ],
)
def test_start_failure_decisions(old, url, expected):
    assert start_failure(old, url) is expected


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
