"""The plug-in protocols a deployment registers by name, so that one fleet speaks
several: ``UPSTREAM_PROTOCOLS``, a JSON object of names to ``package.module:factory``
(``{"acme-feed": "acme.feed:factory"}``).

Both sides read the same setting: the workers load each factory at start and build
one instance per connection that names it; the router takes the names only (it never
runs plug-in code) and admits a start's ``"protocol": {"name": "acme-feed", ...}``
when the name is registered. The construct checks its ``upstream_protocols`` option by
these rules at synth and sets the one value on both. Pure and dependency-free, like
:mod:`wsfleet.protocol_specs`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from wsfleet.protocol_specs import PROTOCOL_NAMES

UPSTREAM_PROTOCOLS: Final = "UPSTREAM_PROTOCOLS"
NAME_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""A registered name: lower-case letters, digits and ``-``, 1 to 63 of them."""
FACTORY_PATTERN: Final = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""``package.module:factory``, the form ``HANDLER`` takes too."""
MAX_PROTOCOLS: Final = 32
MAX_REGISTRY_BYTES: Final = 2048
"""The registry as compact JSON at most: it rides in the router function's
environment, which Lambda limits to 4 KB in all."""


class InvalidRegistryError(ValueError):
    """The registry cannot be used; the message names the entry and says why."""


def check_registry(registry: Any) -> dict[str, str]:
    """``registry`` as a plain dict, or :class:`InvalidRegistryError` for the first
    entry that cannot be registered."""
    if not isinstance(registry, Mapping):
        raise InvalidRegistryError(
            'must map names to factories, such as {"acme-feed": "acme.feed:factory"}'
        )
    checked: dict[str, str] = {}
    for name, factory in registry.items():
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidRegistryError(
                f"{name!r} is not a protocol name: 1 to 63 of a-z, 0-9 and -, "
                "starting with a letter or digit"
            )
        if name in PROTOCOL_NAMES:
            raise InvalidRegistryError(
                f"{name!r} is a built-in protocol; a plug-in needs a name of its own"
            )
        if not isinstance(factory, str) or not FACTORY_PATTERN.fullmatch(factory):
            raise InvalidRegistryError(
                f"{name}: the factory must look like 'package.module:factory', got {factory!r}"
            )
        checked[name] = factory
    if len(checked) > MAX_PROTOCOLS:
        raise InvalidRegistryError(f"{len(checked)} protocols, more than {MAX_PROTOCOLS}")
    size = len(registry_text(checked).encode())
    if size > MAX_REGISTRY_BYTES:
        raise InvalidRegistryError(f"{size} bytes as compact JSON, more than {MAX_REGISTRY_BYTES}")
    return checked


def parse_registry(text: str | None) -> dict[str, str]:
    """The setting's value (unset or blank: no plug-ins), checked."""
    if text is None or not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise InvalidRegistryError(
            'is not JSON: give an object such as {"acme-feed": "acme.feed:factory"}'
        ) from None
    return check_registry(raw)


def registry_text(registry: Mapping[str, str]) -> str:
    """The setting's value: compact JSON, names sorted (two equal registries alike)."""
    return json.dumps(dict(sorted(registry.items())), separators=(",", ":"))
