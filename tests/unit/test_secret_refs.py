"""Secret references: only names and ARNs under the allowed prefix pass."""

from __future__ import annotations

import pytest

from wsfleet.secret_refs import (
    InvalidSecretRefError,
    check_prefix,
    check_secret_ref,
    secret_arn_pattern,
    secret_name,
)

PREFIX = "websocket-fleet/"
ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:websocket-fleet/feed-AbC123"


@pytest.mark.parametrize("ref", ["websocket-fleet/feed", "websocket-fleet/a/b_c+d=e.f@g-h", ARN])
def test_references_under_the_prefix_pass(ref):
    assert check_secret_ref(ref, PREFIX) == ref


@pytest.mark.parametrize(
    ("ref", "prefix", "says"),
    [
        ("websocket-fleet/feed", None, "accepts no secret references"),
        ("other/feed", PREFIX, "under 'websocket-fleet/'"),
        ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:other/x", PREFIX, "under"),
        ("websocket-fleet", PREFIX, "under"),
        ("websocket-fleet/feed with space", PREFIX, "secret name"),
        ("arn:aws:s3:::bucket/websocket-fleet/x", PREFIX, "secret name"),
        ("", PREFIX, "secret name or ARN"),
        (42, PREFIX, "secret name or ARN"),
        ("websocket-fleet/" + "x" * 2100, PREFIX, "secret name or ARN"),
    ],
)
def test_other_references_are_refused(ref, prefix, says):
    with pytest.raises(InvalidSecretRefError) as caught:
        check_secret_ref(ref, prefix)
    assert says in str(caught.value)


def test_the_name_inside_an_arn():
    assert secret_name(ARN) == "websocket-fleet/feed-AbC123"
    assert secret_name("plain/name") == "plain/name"


def test_the_iam_pattern_covers_the_prefix_only():
    pattern = secret_arn_pattern(
        PREFIX, partition="aws", region="eu-west-1", account="123456789012"
    )
    assert pattern == "arn:aws:secretsmanager:eu-west-1:123456789012:secret:websocket-fleet/*"
    with pytest.raises(InvalidSecretRefError):
        check_prefix("")
    with pytest.raises(InvalidSecretRefError):
        check_prefix("bad prefix")
