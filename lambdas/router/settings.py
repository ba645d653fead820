"""Router settings from the environment, read once per Lambda container."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from lambdas.router.url_policy import UrlPolicy

TABLE_NAME: Final = "TABLE_NAME"
QUEUE_URL: Final = "QUEUE_URL"
ALLOWED_UPSTREAM_HOSTS: Final = "ALLOWED_UPSTREAM_HOSTS"
ALLOW_INSECURE_WS: Final = "ALLOW_INSECURE_WS"


class SettingsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RouterSettings:
    table_name: str
    queue_url: str
    url_policy: UrlPolicy

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RouterSettings:
        env = os.environ if env is None else env
        missing = [name for name in (TABLE_NAME, QUEUE_URL) if not env.get(name)]
        if missing:
            raise SettingsError(f"missing settings: {', '.join(missing)}")
        insecure = env.get(ALLOW_INSECURE_WS, "false").strip().lower()
        if insecure not in ("true", "false"):
            raise SettingsError(f"{ALLOW_INSECURE_WS} must be true or false")
        return cls(
            table_name=env[TABLE_NAME],
            queue_url=env[QUEUE_URL],
            url_policy=UrlPolicy.from_settings(
                env.get(ALLOWED_UPSTREAM_HOSTS, ""), allow_insecure_ws=insecure == "true"
            ),
        )
