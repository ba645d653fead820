"""Reading a Firehose object (:mod:`wsfleet.firehose_objects`): one envelope a line, a
bad line reported and passed over, gzip, S3 event keys; and what the recipe does with
each decision, with a stand-in for the deduper (the real one runs against DynamoDB
Local in tests/integration/test_firehose_objects.py)."""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from wsfleet.deduper import Decision, Deduper, Outcome
from wsfleet.envelope import Envelope, EnvelopeError
from wsfleet.firehose_objects import (
    SHOWN_BYTES,
    BadLine,
    ObjectTally,
    apply_object,
    apply_object_at_least_once,
    object_lines,
    read_envelopes,
    s3_event_objects,
)

NOW = 1_767_225_600_000


def env(seq: int, cid: str = "btc-eth") -> Envelope:
    return Envelope(cid, 1, 0, seq, NOW, {"p": seq}, prev_seq=seq - 1 if seq > 1 else None)


def line(seq: int) -> bytes:
    return env(seq).to_bytes() + b"\n"


def read(data: bytes) -> tuple[list[int], list[tuple[int, str]]]:
    bad: list[BadLine] = []
    seqs = [e.seq for e in read_envelopes(data, bad.append)]
    return seqs, [(b.number, b.error) for b in bad]


def test_each_line_is_an_envelope_in_the_objects_order():
    assert read(line(3) + line(1) + line(2)) == ([3, 1, 2], [])
    assert list(read_envelopes(line(1))) == [env(1)]


@pytest.mark.parametrize(
    ("data", "seqs", "bad"),
    [
        (line(1) + b"not json\n" + line(2), [1, 2], [(2, "not JSON")]),
        (b'{"a": 1}\n' + line(1), [1], [(1, "envelope keys are")]),
        (line(1) + b"\xff\xfe\n" + line(2), [1, 2], [(2, "UTF-8")]),
        (line(1) + line(2)[:-5] + b"\n" + line(3), [1, 3], [(2, "not JSON")]),  # cut short
        (line(1) + b"\n\n  \n" + line(2), [1, 2], []),  # blank lines hold no record
        (line(1) + line(2)[:-1], [1, 2], []),  # no newline after the last
        (line(1).replace(b"\n", b"\r\n") + line(2), [1, 2], []),
        (b"", [], []),
    ],
)
def test_a_line_that_is_no_envelope_is_reported_and_the_rest_read(data, seqs, bad):
    got_seqs, got_bad = read(data)
    assert got_seqs == seqs
    assert [n for n, _ in got_bad] == [n for n, _ in bad]
    for (_, error), (_, expected) in zip(got_bad, bad, strict=True):
        assert expected in error


def test_a_bad_line_keeps_only_its_start():
    long = b"x" * (SHOWN_BYTES + 50)
    bad: list[BadLine] = []
    assert list(read_envelopes(long + b"\n", bad.append)) == []
    assert bad[0].start == long[:SHOWN_BYTES]


def test_bad_lines_are_logged_by_default(caplog):
    assert [e.seq for e in read_envelopes(b"nope\n" + line(4))] == [4]
    assert "line 1 is no envelope, passed over" in caplog.text


def test_a_gzip_object_is_read_as_the_lines_it_holds():
    data = line(1) + b"bad\n" + line(2)
    assert read(gzip.compress(data)) == read(data)
    assert read(data)[0] == [1, 2]
    assert [n for n, _ in read(data)[1]] == [2]


def test_gzip_that_does_not_decompress_is_an_error_of_the_whole_object():
    with pytest.raises(EnvelopeError, match="gzip that does not decompress"):
        object_lines(gzip.compress(line(1))[:-8] + b"\x00")
    with pytest.raises(EnvelopeError, match="gzip that does not decompress"):
        object_lines(b"\x1f\x8b" + b"garbage")


@pytest.mark.parametrize(
    ("key", "decoded"),
    [
        ("messages/2026/01/01/00/to-s3-1-2026-01-01-00-00-00-abc", None),
        ("with+space/a%3Db", "with space/a=b"),
    ],
)
def test_s3_event_keys_are_decoded(key, decoded):
    event = {"Records": [{"s3": {"bucket": {"name": "envelopes"}, "object": {"key": key}}}]}
    assert list(s3_event_objects(event)) == [("envelopes", decoded or key)]
    assert list(s3_event_objects({})) == []


class StandIn:
    """A deduper in the unordered mode as the recipe sees it: ``decisions`` by seq
    (APPLY when missing), an :class:`EnvelopeError` for the seqs in ``refused``."""

    ordered = False

    def __init__(
        self, decisions: Mapping[int, Decision] | None = None, refused: set[int] | None = None
    ) -> None:
        self.decisions = dict(decisions or {})
        self.refused = refused or set()
        self.calls: list[tuple[str, int]] = []

    def _decide(self, name: str, envelope: Envelope) -> Outcome:
        self.calls.append((name, envelope.seq))
        if envelope.seq in self.refused:
            raise EnvelopeError("no decision on this one")
        return Outcome(self.decisions.get(envelope.seq, Decision.APPLY))

    def transact(self, envelope: Envelope, effects: Sequence[Mapping[str, Any]]) -> Outcome:
        assert effects == [{"for": envelope.seq}]
        return self._decide("transact", envelope)

    def preview(self, envelope: Envelope) -> Outcome:
        return self._decide("preview", envelope)

    def decide(self, envelope: Envelope) -> Outcome:
        return self._decide("decide", envelope)


def test_apply_object_counts_each_decision_and_passes_a_refused_envelope_over():
    deduper = StandIn({2: Decision.SKIP}, refused={3})
    bad: list[BadLine] = []
    data = line(1) + line(2) + b"junk\n" + line(3) + line(4)
    tally = apply_object(
        data,
        deduper,  # type: ignore[arg-type]
        lambda e: [{"for": e.seq}],
        on_bad_line=bad.append,
    )
    assert (tally.applied, tally.skipped) == (2, 1)
    assert [(b.number, b.error) for b in tally.bad_lines] == [
        (3, "not JSON: Expecting value: line 1 column 1 (char 0)"),
        (4, "no decision on this one"),
    ]
    assert tally.bad_lines == bad
    assert deduper.calls == [("transact", s) for s in (1, 2, 3, 4)]


def test_the_at_least_once_recipe_makes_the_effect_only_for_a_new_message_then_records_it():
    deduper = StandIn({2: Decision.SKIP})
    made: list[int] = []

    def effect(envelope: Envelope) -> None:
        made.append(envelope.seq)
        assert deduper.calls[-1] == ("preview", envelope.seq)  # recorded after the effect

    tally = apply_object_at_least_once(line(1) + line(2), deduper, effect)  # type: ignore[arg-type]
    assert made == [1]
    assert deduper.calls == [("preview", 1), ("decide", 1), ("preview", 2)]
    assert tally == ObjectTally(applied=1, skipped=1)


def test_an_ordered_deduper_is_refused_before_anything_is_read():
    ordered = Deduper(object(), "dedup")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be unordered"):
        apply_object(line(1), ordered, lambda e: [])
    with pytest.raises(ValueError, match="must be unordered"):
        apply_object_at_least_once(line(1), ordered, lambda e: None)
