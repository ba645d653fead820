"""Loading ``module:factory`` plug-ins named in the environment."""

from __future__ import annotations

import importlib
from typing import Any


class PluginError(ValueError):
    """A plug-in spec that does not name a callable factory."""


def load_factory(spec: str, *, setting: str) -> Any:
    """Import ``package.module:factory``, call the factory with no arguments once and
    return what it made. Errors name the setting so the operator knows what to fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{setting} must look like 'package.module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PluginError(f"{setting}: cannot import {module_name!r}: {error}") from error
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PluginError(f"{setting}: {module_name}.{attr} is not a callable factory")
    return factory()
