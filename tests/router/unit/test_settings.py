"""Router settings from the environment: the secret prefix."""

from __future__ import annotations

import pytest

from lambdas.router.settings import RouterSettings, SettingsError

BASE = {"TABLE_NAME": "t", "QUEUE_URL": "q"}


def test_without_a_prefix_no_references_are_accepted() -> None:
    assert RouterSettings.from_env(BASE).secret_prefix is None
    assert RouterSettings.from_env(BASE | {"ALLOWED_SECRET_PREFIX": " "}).secret_prefix is None


def test_the_prefix_is_read() -> None:
    env = BASE | {"ALLOWED_SECRET_PREFIX": "websocket-fleet/"}
    assert RouterSettings.from_env(env).secret_prefix == "websocket-fleet/"


@pytest.mark.parametrize("prefix", ["has space/", "*", "a" * 257, "websocket-fleet/*"])
def test_an_unusable_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(SettingsError, match="ALLOWED_SECRET_PREFIX"):
        RouterSettings.from_env(BASE | {"ALLOWED_SECRET_PREFIX": prefix})
