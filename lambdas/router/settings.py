"""Router settings from the environment, read once per Lambda container."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from lambdas.router.url_policy import UrlPolicy
from wsfleet import protocol_registry
from wsfleet.protocol_registry import InvalidRegistryError, parse_registry
from wsfleet.secret_refs import InvalidSecretRefError, check_prefix

TABLE_NAME: Final = "TABLE_NAME"
QUEUE_URL: Final = "QUEUE_URL"
ALLOWED_UPSTREAM_HOSTS: Final = "ALLOWED_UPSTREAM_HOSTS"
ALLOW_INSECURE_WS: Final = "ALLOW_INSECURE_WS"
ALLOWED_SECRET_PREFIX: Final = "ALLOWED_SECRET_PREFIX"
"""Secret references a start may carry must name a secret under this prefix (the
prefix the worker task role may read); unset or empty: no references are accepted."""
UPSTREAM_PROTOCOLS: Final = protocol_registry.UPSTREAM_PROTOCOLS
"""The plug-in protocols the deployment registered, the workers' very setting
(:mod:`wsfleet.protocol_registry`); the router reads the names only. Unset: a start
may name the built-in protocols only."""


class SettingsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RouterSettings:
    table_name: str
    queue_url: str
    url_policy: UrlPolicy
    secret_prefix: str | None = None
    """``ALLOWED_SECRET_PREFIX``; None: every ``auth`` is refused."""
    plugin_protocols: frozenset[str] = frozenset()
    """The names of ``UPSTREAM_PROTOCOLS``: the plug-ins a start's protocol may name."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RouterSettings:
        env = os.environ if env is None else env
        missing = [name for name in (TABLE_NAME, QUEUE_URL) if not env.get(name)]
        if missing:
            raise SettingsError(f"missing settings: {', '.join(missing)}")
        insecure = env.get(ALLOW_INSECURE_WS, "false").strip().lower()
        if insecure not in ("true", "false"):
            raise SettingsError(f"{ALLOW_INSECURE_WS} must be true or false")
        prefix = env.get(ALLOWED_SECRET_PREFIX, "").strip() or None
        if prefix is not None:
            try:
                check_prefix(prefix)
            except InvalidSecretRefError as error:
                raise SettingsError(f"{ALLOWED_SECRET_PREFIX}: {error}") from None
        try:
            plugins = parse_registry(env.get(UPSTREAM_PROTOCOLS))
        except InvalidRegistryError as error:
            raise SettingsError(f"{UPSTREAM_PROTOCOLS}: {error}") from None
        return cls(
            table_name=env[TABLE_NAME],
            queue_url=env[QUEUE_URL],
            url_policy=UrlPolicy.from_settings(
                env.get(ALLOWED_UPSTREAM_HOSTS, ""), allow_insecure_ws=insecure == "true"
            ),
            secret_prefix=prefix,
            plugin_protocols=frozenset(plugins),
        )
