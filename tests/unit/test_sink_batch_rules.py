"""The sinks' pure decisions: requests within the count and byte limits, what is sent
again after a partial failure, the record size check, the SQS deduplication id."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from worker.sinks.batch_rules import (
    FIREHOSE_LIMITS,
    KINESIS_LIMITS,
    SQS_LIMITS,
    Limits,
    deduplication_id,
    first_request_length,
    is_throttle,
    landed_in_order,
    next_window,
    to_send_again,
)
from wsfleet.sink_limits import MIB

SMALL = Limits("Test", max_count=3, max_bytes=10, max_record_bytes=10)


def split(sizes: Sequence[int], limits: Limits) -> list[int]:
    """The request lengths that send ``sizes`` when nothing is refused."""
    lengths = []
    rest = list(sizes)
    while rest:
        length = first_request_length(iter(rest), limits)
        lengths.append(length)
        rest = rest[length:]
    return lengths


@pytest.mark.parametrize(
    ("sizes", "lengths"),
    [
        ([], []),
        ([1], [1]),
        ([1, 1, 1], [3]),
        ([1, 1, 1, 1], [3, 1]),  # the count limit
        ([1] * 7, [3, 3, 1]),
        ([5, 5], [2]),  # exactly the byte limit
        ([5, 5, 1], [2, 1]),
        ([5, 6], [1, 1]),  # one byte over
        ([10, 10, 10], [1, 1, 1]),  # records of the whole request size go alone
        ([9, 1, 1], [2, 1]),
        ([1, 9, 1], [2, 1]),
    ],
)
def test_requests_take_records_in_order_up_to_either_limit(sizes, lengths):
    assert split(sizes, SMALL) == lengths


@pytest.mark.parametrize(
    ("limits", "sizes", "lengths"),
    [
        (KINESIS_LIMITS, [100] * 1001, [500, 500, 1]),
        (KINESIS_LIMITS, [MIB] * 6, [5, 1]),
        (KINESIS_LIMITS, [MIB, MIB, MIB, MIB, MIB - 1, 2], [5, 1]),
        (FIREHOSE_LIMITS, [MIB - 1] * 5, [4, 1]),
        (SQS_LIMITS, [100] * 21, [10, 10, 1]),
        (SQS_LIMITS, [128 * 1024, 128 * 1024, 1], [2, 1]),
    ],
)
def test_the_services_limits(limits, sizes, lengths):
    assert split(sizes, limits) == lengths


def test_sizes_are_read_only_as_far_as_the_request_goes():
    read = []

    def sizes():
        for size in [4, 4, 4, 4]:
            read.append(size)
            yield size

    assert first_request_length(sizes(), SMALL) == 2
    assert len(read) == 3  # the third, to find it does not fit; not the fourth


@pytest.mark.parametrize(
    ("keys", "failed", "in_order", "refused_only"),
    [
        ("aaa", [False, False, False], [], []),
        ("aaa", [True, False, False], [0, 1, 2], [0]),
        ("aaa", [False, True, False], [1, 2], [1]),
        ("aaa", [False, False, True], [2], [2]),
        ("aaa", [False, True, True], [1, 2], [1, 2]),
        # Another connection's records go again only if one of its own was refused.
        ("abab", [True, False, False, False], [0, 2], [0]),
        ("abab", [False, True, False, False], [1, 3], [1]),
        ("abab", [False, True, True, False], [1, 2, 3], [1, 2]),
        ("aabb", [False, True, False, True], [1, 3], [1, 3]),
        ("abcabc", [False, False, True, True, False, False], [2, 3, 5], [2, 3]),
    ],
)
def test_what_is_sent_again_after_a_partial_failure(keys, failed, in_order, refused_only):
    assert to_send_again(list(keys), failed, keep_order=True) == in_order
    assert to_send_again(list(keys), failed, keep_order=False) == refused_only


def test_keys_and_outcomes_must_match():
    with pytest.raises(ValueError, match="2 keys but 1 outcomes"):
        to_send_again(["a", "b"], [True], keep_order=True)


@pytest.mark.parametrize(
    ("window", "sent", "landed", "after"),
    [
        (500, 500, 500, 500),  # taken whole at the count limit: stays there
        (4, 4, 4, 8),  # taken whole: twice as many
        (1, 1, 1, 2),
        (500, 500, 120, 120),  # throttled: what was taken
        (120, 120, 0, 1),  # nothing taken: one at a time
        (8, 3, 3, 16),  # a short request taken whole grows from the window
    ],
)
def test_the_window_follows_what_the_destination_takes(window, sent, landed, after):
    assert next_window(window, sent, landed, KINESIS_LIMITS) == after


def test_the_window_never_passes_the_services_count():
    assert next_window(8, 8, 8, SQS_LIMITS) == 10


@pytest.mark.parametrize(
    ("keys", "landed", "counts"),
    [
        ("aaa", [True, True, True], {"a": 3}),
        ("aaa", [True, False, True], {"a": 1}),  # the third landed ahead of the second
        ("aaa", [False, True, True], {"a": 0}),
        ("abab", [True, False, True, True], {"a": 2, "b": 0}),
        ("", [], {}),
    ],
)
def test_what_a_call_landed_in_order_per_connection(keys, landed, counts):
    assert landed_in_order(list(keys), landed) == counts


def test_landed_keys_and_outcomes_must_match():
    with pytest.raises(ValueError, match="2 keys but 1 outcomes"):
        landed_in_order(["a", "b"], [True])


@pytest.mark.parametrize(
    ("code", "throttle"),
    [
        ("ProvisionedThroughputExceededException", True),
        ("ServiceUnavailableException", True),
        ("InternalFailure", True),
        ("KMSAccessDeniedException", False),
        ("InvalidMessageContents", False),
    ],
)
def test_which_refusals_are_waited_out(code, throttle):
    assert is_throttle(code) is throttle


def test_the_deduplication_id_names_one_send_of_a_message_within_sqs_rules():
    ident = deduplication_id("btc-eth", 0, 42, "0.25.1")
    assert ident == deduplication_id("btc-eth", 0, 42, "0.25.1")  # the request sent again
    assert ident != deduplication_id("btc-eth", 0, 42, "0.25.2")  # a later send lands
    assert re.fullmatch(r"[0-9a-f]{64}", ident)
    longest = deduplication_id("c" * 128, 2**63, 2**63, "0.12345678901234567.99999")
    assert len(longest) == 64


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("c", 0, 1, "t.1"), ("c", 0, 2, "t.1")),
        (("c", 0, 1, "t.1"), ("c", 1, 1, "t.1")),
        (("c", 0, 1, "t.1"), ("d", 0, 1, "t.1")),
        (("c", 1, 11, "t.1"), ("c", 11, 1, "t.1")),
        (("c1", 1, 1, "t.1"), ("c", 11, 1, "t.1")),  # a plain concatenation would confuse these
    ],
)
def test_different_messages_have_different_deduplication_ids(one, other):
    assert deduplication_id(*one) != deduplication_id(*other)
