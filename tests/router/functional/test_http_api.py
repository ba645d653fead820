"""Every route over real HTTP through the local adapter, against DynamoDB Local and
moto's SQS server."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any
from urllib.parse import urlencode

import pytest

from local_stack.clock import now_ms
from local_stack.resources import Queues
from local_stack.services import local_client
from tests.router.fixtures import drain_start_messages, snapshot
from tests.router.local_api import Answer, request
from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.checkpoint_page import PageEntry
from wsfleet.item_io import get_connection
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.start_messages import StartMessage
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(120))

FEED = "ws://127.0.0.1:8765/stream-a"
FEED_B = "ws://127.0.0.1:8765/stream-b"


def start(api: str, connection_id: str | None, ws_url: str = FEED) -> Answer:
    body = {"ws_url": ws_url} | ({"connection_id": connection_id} if connection_id else {})
    return request(api, "POST", "/connections", body)


def test_create_get_list_stop_over_http(api: str, sqs: Any, queues: Queues) -> None:
    created = start(api, "demo-1")
    assert created.status == 201
    assert created.headers["content-type"] == "application/json"
    assert created.body["outcome"] == "created"
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "demo-1")]

    got = request(api, "GET", "/connections/demo-1")
    assert got.status == 200
    assert (got.body["state"], got.body["ws_url"], got.body["start_gen"]) == ("STARTED", FEED, 1)

    listed = request(api, "GET", "/connections?state=STARTED")
    assert listed.status == 200
    assert [v["connection_id"] for v in listed.body["connections"]] == ["demo-1"]
    assert listed.body["next_token"] is None

    stopped = request(api, "DELETE", "/connections/demo-1")
    assert stopped.status == 202
    assert stopped.body["state"] == "STOPPED"
    assert request(api, "DELETE", "/connections/demo-1").status == 202  # idempotent
    assert request(api, "GET", "/connections?state=STARTED").body["connections"] == []
    stopped_list = request(api, "GET", "/connections?state=STOPPED").body["connections"]
    assert [v["connection_id"] for v in stopped_list] == ["demo-1"]
    assert drain_start_messages(sqs, queues.queue_url) == []


def test_unknown_ids_are_404_and_bad_ids_400(api: str) -> None:
    for method in ("GET", "DELETE"):
        missing = request(api, method, "/connections/nobody")
        assert (missing.status, missing.body["error"]) == (404, "not_found")
        bad = request(api, method, "/connections/bad%20id")
        assert (bad.status, bad.body["error"]) == (400, "invalid_connection_id")


def test_list_paginates_across_pages(api: str) -> None:
    ids = sorted(f"page-{i:02d}" for i in range(11))
    for connection_id in ids:
        assert start(api, connection_id, f"ws://127.0.0.1:8765/{connection_id}").status == 201
    for i in range(0, 11, 3):  # stop a few, to page through both states too
        assert request(api, "DELETE", f"/connections/{ids[i]}").status == 202

    def pages(**query: str) -> list[list[str]]:
        found: list[list[str]] = []
        token: str | None = None
        for _ in range(20):
            params = dict(query) | ({"next_token": token} if token else {})
            answer = request(api, "GET", f"/connections?{urlencode(params)}")
            assert answer.status == 200, answer
            found.append([v["connection_id"] for v in answer.body["connections"]])
            token = answer.body["next_token"]
            if token is None:
                return found
        raise AssertionError("pagination does not end")

    everything = pages(limit="4")
    assert all(len(page) <= 4 for page in everything)
    assert len(everything) >= 3
    assert sorted(chain.from_iterable(everything)) == ids
    stopped = {ids[i] for i in range(0, 11, 3)}
    started_pages = pages(state="STARTED", limit="2")
    assert sorted(chain.from_iterable(started_pages)) == sorted(set(ids) - stopped)
    assert sorted(chain.from_iterable(pages(state="STOPPED", limit="1"))) == sorted(stopped)


def test_twenty_concurrent_identical_starts_create_once(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    barrier = threading.Barrier(20, timeout=scaled(30))

    def one() -> Answer:
        barrier.wait()
        return start(api, "racy", FEED)

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(lambda _: one(), range(20)))

    assert Counter(a.status for a in answers) == {201: 1, 200: 19}, [a.body for a in answers]
    assert Counter(a.body["outcome"] for a in answers) == {"created": 1, "already_started": 19}
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "racy")]
    item = request(api, "GET", "/connections/racy").body
    assert (item["start_gen"], item["epoch"], item["last_seq"]) == (1, 0, 0)


def test_concurrent_requests_each_get_their_own_answer(api: str) -> None:
    ids = [f"mixed-{i}" for i in range(12)]
    for connection_id in ids:
        start(api, connection_id, f"ws://127.0.0.1:8765/{connection_id}")
    barrier = threading.Barrier(len(ids) * 2, timeout=scaled(30))

    def get(connection_id: str) -> tuple[str, Answer]:
        barrier.wait()
        return connection_id, request(api, "GET", f"/connections/{connection_id}")

    def refused(connection_id: str) -> tuple[str, Answer]:
        barrier.wait()
        return connection_id, request(api, "POST", "/connections", {"ws_url": 7})

    with ThreadPoolExecutor(max_workers=len(ids) * 2) as pool:
        futures = [pool.submit(get, cid) for cid in ids] + [pool.submit(refused, c) for c in ids]
        results = [f.result(timeout=scaled(60)) for f in futures]

    for connection_id, answer in results[: len(ids)]:
        assert answer.status == 200, answer
        assert answer.body["connection_id"] == connection_id
    for _, answer in results[len(ids) :]:
        assert answer.status == 400, answer


def test_repeated_stops_and_starts_stay_consistent(api: str, sqs: Any, queues: Queues) -> None:
    for round_ in range(5):
        assert start(api, "flip").status == 201
        assert start(api, "flip").status == 200
        assert request(api, "DELETE", "/connections/flip").status == 202
        assert request(api, "GET", "/connections/flip").body["start_gen"] == round_ + 1
    assert len(drain_start_messages(sqs, queues.queue_url)) == 5


TIMING = LeaseTiming.from_lease(2.0)


def own(
    ddb: Any, table: str, connection_id: str, worker: str = "test-worker", gen: int = 1
) -> Lease:
    """Take the connection as a worker session would (the session item is not needed
    for the take itself)."""
    lease = LeaseStore(ddb, table, TIMING).acquire(connection_id, worker, gen, now_ms())
    assert isinstance(lease, Lease), lease
    return lease


def checkpoint(ddb: Any, table: str, connection_id: str, last_seq: int) -> Lease:
    """Take the connection as a worker would and release it with ``last_seq`` as its
    final checkpoint."""
    lease = own(ddb, table, connection_id)
    assert LeaseStore(ddb, table, TIMING).release(lease, last_seq, now_ms()).released
    return lease


@pytest.mark.parametrize(
    ("second_url", "expected_seq"), [(FEED, 25), (FEED_B, 0)], ids=["same-url", "new-url"]
)
def test_restart_after_stop(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues, second_url: str, expected_seq: int
) -> None:
    assert start(api, "restart", FEED).status == 201
    checkpoint(ddb, table, "restart", 25)
    assert request(api, "GET", "/connections/restart").body["last_seq"] == 25
    assert request(api, "DELETE", "/connections/restart").status == 202
    drain_start_messages(sqs, queues.queue_url)

    again = start(api, "restart", second_url)

    assert again.status == 201
    assert again.body["outcome"] == "restarted"
    assert again.body["ws_url"] == second_url
    assert again.body["last_seq"] == expected_seq
    assert again.body["start_gen"] == 2
    assert again.body["epoch"] == 1  # the epoch never goes back
    assert again.body["expires_at"] is None
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "restart")]


def test_another_url_while_started_is_409(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    start(api, "busy", FEED)
    before = snapshot(ddb, sqs, table, queues.queue_url)
    conflict = start(api, "busy", FEED_B)
    assert (conflict.status, conflict.body["error"]) == (409, "conflict")
    assert snapshot(ddb, sqs, table, queues.queue_url) == before


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b'{"ws_url": ', 400, "invalid_json"),
        (b"\xff\xfe\x00garbage", 400, "invalid_body"),
        (
            b'{"ws_url": "ws://127.0.0.1:8765/x", "metadata": {"b": "' + b"x" * 17_000 + b'"}}',
            413,
            "body_too_large",
        ),
        (b"[" * 3000 + b"]" * 3000, 400, "invalid_json"),
        (b'{"ws_url": "ws://10.0.0.1/"}', 400, "address_not_allowed"),
        (b'{"ws_url": "ws://evil.example.org/"}', 400, "host_not_allowed"),
        (b'{"ws_url": "ws://127.0.0.1:8765/x", "extra": true}', 400, "validation_error"),
    ],
)
def test_bad_bodies_over_http_are_4xx_and_change_nothing(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues, raw: bytes, status: int, code: str
) -> None:
    before = snapshot(ddb, sqs, table, queues.queue_url)
    answer = request(api, "POST", "/connections", raw=raw)
    assert (answer.status, answer.body) == (
        status,
        {"error": code, "message": answer.body["message"]},
    )
    assert snapshot(ddb, sqs, table, queues.queue_url) == before


def test_curl_style_form_content_type_still_reads_json(api: str) -> None:
    answer = request(
        api,
        "POST",
        "/connections",
        {"connection_id": "curl", "ws_url": FEED},
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status == 201, answer


def test_racing_starts_are_decided_by_conditional_writes(
    ddb: Any, sqs: Any, table: str, queues: Queues, dynamodb_endpoint: str, moto_endpoint: str
) -> None:
    """The adapter resolves one request at a time (Powertools keeps request state in
    class attributes), so this races the service itself: 20 threads, each with its own
    clients, as 20 Lambda containers would."""
    from lambdas.router.service import ConnectionConflictError, ConnectionService
    from lambdas.router.settings import RouterSettings
    from wsfleet.desired_state import StartOutcome

    settings = RouterSettings.from_env(
        {
            "TABLE_NAME": table,
            "QUEUE_URL": queues.queue_url,
            "ALLOWED_UPSTREAM_HOSTS": "127.0.0.1",
            "ALLOW_INSECURE_WS": "true",
        }
    )
    clients = [
        (
            local_client("dynamodb", dynamodb_endpoint),
            local_client("sqs", moto_endpoint),
        )
        for _ in range(20)
    ]
    services = [ConnectionService(dynamodb=d, sqs=q, settings=settings) for d, q in clients]
    barrier = threading.Barrier(len(services), timeout=scaled(30))

    def race(service: ConnectionService, url: str) -> StartOutcome:
        barrier.wait()
        try:
            return service.start("contested", url).outcome
        except ConnectionConflictError:
            return StartOutcome.CONFLICT

    urls = [FEED] * 15 + [FEED_B] * 5
    try:
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            outcomes = list(pool.map(race, services, urls))
        item = services[0].get("contested")
    finally:
        for dynamodb, queue in clients:
            dynamodb.close()
            queue.close()

    counts = Counter(outcomes)
    assert counts[StartOutcome.CREATED] == 1
    assert counts[StartOutcome.RESTARTED] == 0
    winner_url = urls[outcomes.index(StartOutcome.CREATED)]
    same = sum(1 for url in urls if url == winner_url) - 1
    assert counts[StartOutcome.ALREADY_STARTED] == same
    assert counts[StartOutcome.CONFLICT] == len(urls) - 1 - same
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "contested")]
    assert (item.ws_url, item.start_gen) == (winner_url, 1)


def park(ddb: Any, table: str, connection_id: str, last_seq: int, reason: str) -> None:
    """Take the connection as a worker would, then give the upstream up (the park write)."""
    store = LeaseStore(ddb, table, TIMING)
    now = now_ms()
    lease = own(ddb, table, connection_id)
    assert store.record_failing_since(lease, now, now)
    assert store.park(lease, last_seq, reason, now + 1).parked


@pytest.mark.parametrize(
    ("second_url", "expected_seq", "expected_seq_gen"),
    [(FEED, 25, 0), (FEED_B, 0, 1)],
    ids=["same-url", "new-url"],
)
def test_a_parked_connection_is_shown_and_a_start_re_arms_it(
    api: str,
    ddb: Any,
    sqs: Any,
    table: str,
    queues: Queues,
    second_url: str,
    expected_seq: int,
    expected_seq_gen: int,
) -> None:
    assert start(api, "parked", FEED).status == 201
    park(ddb, table, "parked", 25, "HTTP 404 from upstream")
    drain_start_messages(sqs, queues.queue_url)

    shown = request(api, "GET", "/connections/parked").body
    assert (shown["state"], shown["owner"], shown["session_seconds_left"]) == (
        "STARTED",
        None,
        None,
    )
    assert shown["parked_reason"] == "HTTP 404 from upstream"
    assert shown["parked_at"] is not None
    assert shown["failing_since"] is None
    listed = request(api, "GET", "/connections?state=STARTED").body["connections"]
    assert [(v["connection_id"], v["parked_reason"]) for v in listed] == [
        ("parked", "HTTP 404 from upstream")
    ]

    again = start(api, "parked", second_url)  # 201 for the same URL and another one

    assert (again.status, again.body["outcome"]) == (201, "restarted")
    assert (again.body["ws_url"], again.body["last_seq"]) == (second_url, expected_seq)
    assert again.body["start_gen"] == 2
    assert (again.body["parked_reason"], again.body["parked_at"]) == (None, None)
    assert again.body["failing_since"] is None
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "parked")]
    store = LeaseStore(ddb, table, TIMING)
    assert store.find_unowned(schema.free_shards(), limit=10) == ["parked"]
    item = get_connection(ddb, table, "parked")
    assert item is not None
    assert item.seq_gen == expected_seq_gen
    # Running again: the same start is the usual 200, another URL the usual 409.
    assert start(api, "parked", second_url).status == 200
    assert start(api, "parked", FEED if second_url == FEED_B else FEED_B).status == 409


def test_a_stopped_parked_connection_is_re_armed_by_a_start(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    assert start(api, "parked-stop", FEED).status == 201
    park(ddb, table, "parked-stop", 4, "no message handled for 600 s: ConnectionRefusedError")
    stopped = request(api, "DELETE", "/connections/parked-stop")
    assert stopped.status == 202
    assert stopped.body["state"] == "STOPPED"
    assert stopped.body["parked_reason"].startswith("no message handled for 600 s")
    drain_start_messages(sqs, queues.queue_url)
    again = start(api, "parked-stop", FEED)
    assert (again.status, again.body["state"], again.body["parked_reason"]) == (
        201,
        "STARTED",
        None,
    )
    assert (again.body["last_seq"], again.body["expires_at"]) == (4, None)
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "parked-stop")]


# --- views of owned connections: the owner's session and checkpoint page --------------


def test_views_show_the_owners_session_and_its_pages_checkpoint(
    ddb: Any, table: str, api: str
) -> None:
    """Over HTTP against DynamoDB Local: GET and both listings show the owner's session
    and the page's checkpoint when its entry is the item's hold and stream, the item's
    own checkpoint otherwise, and nothing of a session for a free connection."""
    for connection_id in ("paged", "stale", "free"):
        assert start(api, connection_id, f"ws://127.0.0.1:8765/{connection_id}").status == 201
    sessions = SessionStore(ddb, table, TIMING)
    now = now_ms()
    assert sessions.open("w-views", 3, now, capacity=10)
    paged = own(ddb, table, "paged", "w-views", 3)
    stale = own(ddb, table, "stale", "w-views", 3)
    entries = {
        "paged": PageEntry(paged.epoch, paged.seq_gen, seq=57, advanced_at_ms=now - 40),
        "stale": PageEntry(stale.epoch, stale.seq_gen + 1, seq=99, advanced_at_ms=now - 40),
    }
    assert sessions.write_page("w-views", 3, entries, now, 1)

    got = {
        cid: request(api, "GET", f"/connections/{cid}").body for cid in ("paged", "stale", "free")
    }
    listed = {
        v["connection_id"]: v for v in request(api, "GET", "/connections").body["connections"]
    }
    by_state = request(api, "GET", "/connections?state=STARTED").body["connections"]

    for views in (got, listed, {v["connection_id"]: v for v in by_state}):
        assert set(views) == {"paged", "stale", "free"}
        for cid in ("paged", "stale"):
            assert (views[cid]["owner"], views[cid]["owner_session_gen"]) == ("w-views", 3)
            assert views[cid]["owner_session_state"] == "ALIVE"
            assert 0 < views[cid]["session_seconds_left"] <= TIMING.lease
        assert (views["paged"]["last_seq"], views["stale"]["last_seq"]) == (57, 0)
        assert views["paged"]["checkpoint_age_seconds"] >= 0
        assert views["paged"]["checkpoint_at"] is not None
        assert views["paged"]["last_advanced_at"] is not None
        assert (views["stale"]["checkpoint_at"], views["stale"]["last_advanced_at"]) == (None, None)
        free = views["free"]
        assert (free["owner"], free["owner_session_state"], free["session_seconds_left"]) == (
            None,
            None,
            None,
        )


def test_a_reaped_owner_shows_dead_with_no_time_left(ddb: Any, table: str, api: str) -> None:
    assert start(api, "orphan").status == 201
    sessions = SessionStore(ddb, table, TIMING)
    opened = now_ms() - 10_000  # lapsed long ago
    assert sessions.open("w-dead", 1, opened, capacity=10)
    own(ddb, table, "orphan", "w-dead", 1)
    shown = request(api, "GET", "/connections/orphan").body
    assert (shown["owner_session_state"], shown["session_seconds_left"]) == ("ALIVE", 0.0)
    session = sessions.get_session("w-dead", 1)
    assert session is not None
    assert sessions.reap(session, "w-reaper", now_ms())

    shown = request(api, "GET", "/connections/orphan").body

    assert (shown["owner"], shown["owner_session_state"], shown["session_seconds_left"]) == (
        "w-dead",
        "DEAD",
        0.0,
    )


def test_a_scan_pages_past_sessions_and_pages_and_bad_tokens_are_400(
    ddb: Any, table: str, api: str
) -> None:
    ids = sorted(f"scan-{i}" for i in range(4))
    for connection_id in ids:
        assert start(api, connection_id, f"ws://127.0.0.1:8765/{connection_id}").status == 201
    sessions = SessionStore(ddb, table, TIMING)
    for n in range(8):
        assert sessions.open(f"w-{n}", 1, now_ms(), capacity=10)
        assert sessions.write_page(f"w-{n}", 1, {}, now_ms(), 1)
    for limit in (1, 3):
        seen: list[str] = []
        token: str | None = None
        for _ in range(40):
            query = {"limit": str(limit)} | ({"next_token": token} if token else {})
            answer = request(api, "GET", f"/connections?{urlencode(query)}")
            assert answer.status == 200, answer
            assert len(answer.body["connections"]) <= limit
            seen += [v["connection_id"] for v in answer.body["connections"]]
            token = answer.body["next_token"]
            if token is None:
                break
        assert sorted(seen) == ids  # every connection once, no session or page
    for bad in ("garbage", "eyJrIjp7fX0", "x" * 100):
        refused = request(api, "GET", f"/connections?next_token={bad}")
        assert (refused.status, refused.body["error"]) == (400, "invalid_next_token")
