"""Malformed items put into a running fleet's table cost only themselves: real worker
processes against DynamoDB Local, moto SQS and the demo feed (lease 2 s). Every other
connection keeps flowing, a crashed worker's connections are taken over and a new
start streams within the crash bound, no worker exits, and the router answers 200 for
every other connection."""

from __future__ import annotations

import json
import signal
import time
import zlib
from typing import Any

import pytest

from tests.support.fleet import TIMING, Fleet, wait_until
from tests.support.stores import with_attributes
from tests.support.timing import scaled
from wsfleet import schema

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

CRASH_BOUND = TIMING.crash_failover_bound()


def put(fleet: Fleet, item: dict[str, Any]) -> None:
    fleet.ddb.put_item(TableName=fleet.table, Item=item)


def connection(fleet: Fleet, connection_id: str, **attributes: Any) -> dict[str, Any]:
    """A STARTED, free connection item on the stream of its name, as the router writes
    it, with ``attributes`` on top (None leaves one out)."""
    item: dict[str, Any] = {
        "Pk": {"S": f"CONN#{connection_id}"},
        "Sk": {"S": "CONN"},
        "desired_state": {"S": schema.STARTED},
        "ws_url": {"S": fleet.feed(connection_id)},
        "free_shard": {"S": schema.free_shard(connection_id)},
        "lease_epoch": {"N": "0"},
        "last_seq": {"N": "0"},
        "start_gen": {"N": "1"},
        "seq_gen": {"N": "0"},
    }
    return with_attributes(item, attributes)


def put_malformed_items(fleet: Fleet) -> None:
    past = str(int(time.time() * 1000) - 60_000)
    # Session items: a sort key without a generation, one that is not a number, a
    # state of the wrong type; a dead worker's session that lost its state, with a
    # connection (missing its seq_gen) and a page that does not decompress.
    put(fleet, {"Pk": {"S": "SESSIONS#0"}, "Sk": {"S": "no-generation"}})
    put(fleet, {"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": "w#x"}, "state": {"S": "ALIVE"}})
    put(fleet, {"Pk": {"S": "SESSIONS#2"}, "Sk": {"S": "w#3"}, "state": {"N": "1"}})
    ghost = {"Pk": {"S": schema.session_partition("ghost")}, "Sk": {"S": "ghost#1"}}
    put(fleet, ghost | {"expires_at_ms": {"N": past}})
    put(
        fleet,
        {
            "Pk": {"S": "PAGE#ghost#1"},
            "Sk": {"S": "PAGE"},
            "written_at_ms": {"N": past},
            "entries": {"B": zlib.compress(b'[["orphan",1,0,5,0]]')[:-3]},
        },
    )
    put(
        fleet,
        connection(
            fleet,
            "orphan",
            free_shard=None,
            seq_gen=None,
            lease_owner={"S": "ghost"},
            owner_session_gen={"N": "1"},
            owner_key={"S": schema.owner_key("ghost", 1, "orphan")},
            lease_epoch={"N": "1"},
        ),
    )
    # Free connection items that cannot be run.
    put(fleet, connection(fleet, "bad-protocol", protocol={"N": "5"}))
    put(fleet, connection(fleet, "bad-seq", last_seq={"S": "seventeen"}))
    put(fleet, connection(fleet, "bad-epoch", lease_epoch={"S": "1"}))
    # A page of a live worker's newer version, with a field more per row.
    rows = [["ok-0", 1, 0, 1, 0, "a newer field"]]
    put(
        fleet,
        {
            "Pk": {"S": "PAGE#newer#1"},
            "Sk": {"S": "PAGE"},
            "written_at_ms": {"N": past},
            "entries": {"B": zlib.compress(json.dumps(rows).encode())},
        },
    )


def test_malformed_items_cost_only_themselves(fleet: Fleet):
    workers = [fleet.start_worker("w", MAX_CONNECTIONS="6") for _ in range(2)]
    ids = [f"ok-{i}" for i in range(4)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(15))

    put_malformed_items(fleet)
    # The dead worker's session is reaped although it has no state, and its
    # connection is taken over although the item has no seq_gen.
    fleet.wait_handling(["orphan"], scaled(2 * CRASH_BOUND), min_seq=1)
    for cid in ("bad-protocol", "bad-seq", "bad-epoch"):
        wait_until(lambda cid=cid: fleet.item(cid).parked, scaled(2 * CRASH_BOUND), f"{cid} parked")
    assert fleet.item("bad-protocol").parked_reason == "malformed item: protocol is not a string"
    assert fleet.item("bad-seq").parked_reason == "malformed item: last_seq is not an integer"

    # A crash is still failed over, and a new start still streams, within the bound.
    owners = fleet.owners(ids)
    victim = next(w for w in workers if w.worker_id in owners.values())
    survivor = next(w for w in workers if w is not victim)
    theirs = [cid for cid, owner in owners.items() if owner == victim.worker_id]
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))
    fleet.start_connection("late")
    wait_until(
        lambda: fleet.handled_by_all([*theirs, "late"], survivor.worker_id, after=killed_at),
        scaled(2 * CRASH_BOUND),
        "takeover of the crashed worker's work and the new start",
    )
    fleet.keep_flowing([*ids, "late"])
    # The survivor's slots all came back: it runs everything there is to run.
    assert survivor.alive()
    assert set(fleet.owners([*ids, "late", "orphan"]).values()) == {survivor.worker_id}

    # The router answers for every connection; the malformed one shows its problem.
    for cid in [*ids, "late", "orphan"]:
        assert fleet.api.get(cid)["last_error"] is None, cid
    assert fleet.api.get("bad-seq")["last_error"] == "malformed item: last_seq is not an integer"
    listed = {v["connection_id"] for v in fleet.api.list_all()["connections"]}
    assert {*ids, "late", "orphan", "bad-seq", "bad-protocol", "bad-epoch"} <= listed
